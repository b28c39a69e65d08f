"""The commands README and the documentation site give a new user are the ones that work, and
README's links into the site lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"
PAGES = {p.relative_to(DOCS).as_posix(): p.read_text(encoding="utf-8")
         for p in sorted(DOCS.rglob("*.md"))}
# README and every page of the site: where a user copies commands from.
EVERYTHING = "\n".join([README, *PAGES.values()])


def _commands(prefix: str) -> list[str]:
    """Every `prefix ...` command in README and the docs, in code blocks or inline code,
    joined across the line breaks of a wrapped paragraph."""
    text = re.sub(r"\n\s*", " ", EVERYTHING)
    return re.findall(re.escape(prefix) + r"[^`#&|]*", text)


def test_every_worker_command_shows_progress():
    # Celery's default level, WARNING, hides the line per committed batch.
    commands = _commands("celery -A tasks worker")
    assert commands
    for command in commands:
        assert re.search(r"(-l info|--loglevel[ =]INFO)\b", command), command


def test_flower_is_started_the_way_flower_accepts():
    commands = _commands("celery -A tasks flower")
    assert commands
    for command in commands:
        assert "--port=5555" in command and not re.search(r"--port \d", command), command
        assert "--address=127.0.0.1" in command, command
    operating = PAGES["how-to/operating-workers.md"]
    assert "examforge.reconcile" in operating[operating.index("**Flower.**"):][:1200]


def _nav_pages(node: object) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, list):
        return set().union(*(_nav_pages(n) for n in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(_nav_pages(v) for v in node.values())) if node else set()
    return set()


def _mkdocs_nav() -> set[str]:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use MkDocs' own tags (!ENV, !relative); they say nothing about the nav.
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    return _nav_pages(config["nav"])


def test_readme_is_one_short_page():
    assert len(README.splitlines()) < 300


def test_every_relative_link_in_readme_leads_to_a_file_and_docs_links_to_a_page_of_the_site():
    nav = _mkdocs_nav()
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    relative = [link for link in links if not re.match(r"[a-z]+:|#", link)]
    assert relative
    for link in relative:
        path = link.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README links to {link}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):
            assert path[len("docs/"):] in nav, f"README links to {link}, not in mkdocs.yml's nav"


def test_every_page_of_the_site_is_in_the_nav():
    nav = _mkdocs_nav()
    assert set(PAGES) == nav, (set(PAGES) ^ nav)


HISTORY = re.compile(r"\bissues? #?\d+|\bformerly\b|\bmigrations? \d{4}|\bbefore the reordering\b|"
                     r"\bUpgrading to\b", re.IGNORECASE)


def test_history_lives_in_the_changelog_only():
    # README and the docs say what is true today; what changed, and when, is CHANGELOG.md's.
    for name, text in {"README.md": README, **PAGES}.items():
        found = HISTORY.findall(text)
        assert not found, f"{name} tells history ({found}): move it to CHANGELOG.md"
