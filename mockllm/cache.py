"""The mock's prompt cache, as OpenAI's works: a prompt of 1024 tokens or more that begins
with a prefix the same model saw recently has that prefix read from the cache, in 128-token
increments, and the reply's usage says how much (`prompt_tokens_details.cached_tokens`).

OpenAI's cache is keyed by the exact token prefix (its first 1024 tokens route the request) and
an entry lives a few minutes after its last use. Here: the prompt's tokens, in the order the
provider sees them (each message's role, then its content), are hashed in blocks; a block's
hash covers every token before it, so a hit on block k means the first k blocks are identical.
Hand-written because no library models a provider's prompt cache.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any, Callable

from examforge.tokens import encoding_for

MIN_TOKENS = 1024  # a shorter prompt is never cached
INCREMENT = 128  # the cached part grows in steps of this many tokens
TTL_S = 600.0  # an entry unused this long is gone (OpenAI: 5 to 10 minutes, up to an hour)
MAX_ENTRIES = 200_000  # prefixes kept at most (least recently used go first)


def prompt_token_ids(messages: list[dict[str, Any]], model: str) -> list[int]:
    """The prompt's tokens in order: each message's role, then its text."""
    from mockllm.prompt import message_text

    enc = encoding_for(model)
    out: list[int] = []
    for message in messages:
        for value in (message.get("role"), message_text(message.get("content"))):
            if isinstance(value, str) and value:
                out.extend(enc.encode(value, disallowed_special=()))
    return out


class PromptCache:
    """Prefixes seen recently, per model."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: OrderedDict[tuple[str, int, bytes], float] = OrderedDict()

    def clear(self) -> None:
        self._seen.clear()

    def lookup_and_store(self, model: str, tokens: list[int], prompt_tokens: int) -> int:
        """The cached tokens of this prompt (of its `prompt_tokens` as billed), and remember
        its prefixes for the next requests."""
        if prompt_tokens < MIN_TOKENS or len(tokens) < MIN_TOKENS:
            return 0
        now = self._clock()
        digest = hashlib.blake2b(model.encode(), digest_size=16)
        cached = 0
        hit = True
        # Block boundaries: 1024, 1152, 1280, ... up to the prompt's length.
        end = MIN_TOKENS
        start = 0
        while end <= len(tokens):
            digest.update(b"".join(t.to_bytes(4, "little") for t in tokens[start:end]))
            key = (model, end, digest.copy().digest())
            seen = self._seen.get(key)
            if hit and seen is not None and now - seen <= TTL_S:
                cached = end
            else:
                hit = False
            self._seen[key] = now
            self._seen.move_to_end(key)
            start, end = end, end + INCREMENT
        while len(self._seen) > MAX_ENTRIES:
            self._seen.popitem(last=False)
        return min(cached, prompt_tokens)
