"""MkDocs hook: the generated parts of the reference, made at build time from the code.

- `<!-- settings-table -->` becomes the table of every setting: its environment name, default
  and description from `examforge.settings.Settings`, and the processes that read it from
  `examforge.settings_readers`.
- The benchmark plots of bench/ are added to the site's files.
- `[OAD(openapi.json)]` is pointed at the OpenAPI document of the app `producer serve` runs,
  written to a temporary file at the start of the build; neoteroi-mkdocs's OAD plugin then
  renders it. Nothing is fetched from the network.

The CLI reference needs no hook: mkdocs-click reads the click group `producer.cli:cli`.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the hook runs from any directory; examforge is the repo's
    sys.path.insert(0, str(ROOT))

SETTINGS_MARKER = "<!-- settings-table -->"
OAD_SOURCE = "[OAD(openapi.json)]"

_openapi_path: Path | None = None


def _default(field: Any) -> str:
    from pydantic import SecretStr
    from pydantic_core import PydanticUndefined

    value = field.default
    if value is PydanticUndefined or value is None:
        return "unset"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
        if not value:
            return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        return f"`{value.as_posix() if value.is_absolute() else './' + value.as_posix()}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_table() -> str:
    """The Markdown table of every setting, in the model's order."""
    from examforge.settings import Settings
    from examforge.settings_readers import READ_BY, RECORDED_ON_EXAM, env_name

    rows = ["| setting | default | read by | what it does |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        readers = ", ".join(READ_BY.get(name, ("?",)))
        if name in RECORDED_ON_EXAM:
            readers += " (recorded on the exam)"
        description = _cell(field.description or "–")
        rows.append(f"| `{env_name(name)}` | {_default(field)} | {readers} | {description} |")
    return "\n".join(rows)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document `GET /openapi.json` serves, from an app built with default
    settings (nothing is opened: the document is made from the routes alone)."""
    from examforge.settings import Settings
    from producer.api.app import create_app

    settings = Settings(_env_file=None, api_tokens="docs")  # type: ignore[call-arg]
    return create_app(settings).openapi()


def on_pre_build(config: Any) -> None:
    global _openapi_path
    folder = Path(tempfile.mkdtemp(prefix="examforge-docs-"))
    _openapi_path = folder / "openapi.json"
    _openapi_path.write_text(json.dumps(openapi_document(), indent=1), encoding="utf-8")


def on_files(files: Any, config: Any) -> Any:
    """The benchmark plots (made by `python -m bench` in bench/) go into the site as they are."""
    from mkdocs.structure.files import File

    for plot in sorted((ROOT / "bench").glob("plot-*.png")):
        files.append(File(f"bench/{plot.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def on_post_build(config: Any) -> None:
    global _openapi_path
    if _openapi_path is not None:
        shutil.rmtree(_openapi_path.parent, ignore_errors=True)
        _openapi_path = None


@event_priority(50)  # before the OAD plugin's own on_page_markdown
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_table())
    if OAD_SOURCE in markdown:
        assert _openapi_path is not None
        markdown = markdown.replace(OAD_SOURCE, f"[OAD({_openapi_path.as_posix()})]")
    return markdown
