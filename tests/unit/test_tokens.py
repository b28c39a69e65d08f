"""Which encoding counts each model's prompts, offline, and the margin a worst case adds when
the count is not the model's own."""

from __future__ import annotations

import hashlib
import inspect

import pytest

from examforge import tokens
from examforge.tokens import (
    PROMPT_MARGIN,
    count_text,
    encoding_for,
    encoding_name,
    is_exact,
    reserve_prompt_tokens,
)


@pytest.mark.parametrize(("model", "encoding", "exact"), [
    # GPT-4o, 4.1, 5 and the o-series: o200k_base, counted exactly with no internet.
    ("gpt-4o", "o200k_base", True),
    ("gpt-4o-mini-2024-07-18", "o200k_base", True),
    ("openai/gpt-4o-mini", "o200k_base", True),
    ("gpt-4.1-nano", "o200k_base", True),
    ("gpt-5", "o200k_base", True),
    ("gpt-5-mini", "o200k_base", True),
    ("o1", "o200k_base", True),
    ("o3-mini", "o200k_base", True),
    ("o4-mini", "o200k_base", True),
    # Older OpenAI models: cl100k_base, exact.
    ("gpt-4", "cl100k_base", True),
    ("gpt-4-turbo", "cl100k_base", True),
    ("gpt-3.5-turbo", "cl100k_base", True),
    # No known encoding: cl100k_base as an approximation, with the margin.
    ("llama3.1", "cl100k_base", False),
    ("claude-sonnet-4-5", "cl100k_base", False),
    ("mock-model", "cl100k_base", False),
])
def test_encoding_choice_per_model_family(model, encoding, exact):
    assert encoding_name(model) == encoding
    assert is_exact(model) is exact


def test_o200k_base_is_tiktokens_own_file_and_counts_like_openai():
    """The bundled file is the one tiktoken would download (its SHA-256 is the one in
    tiktoken's own definition), and known texts give OpenAI's token ids."""
    from tiktoken_ext import openai_public

    raw = tokens._bundled_file("o200k_base")
    assert raw is not None
    assert hashlib.sha256(raw).hexdigest() in inspect.getsource(openai_public.o200k_base)
    enc = encoding_for("gpt-4o")
    assert enc.encode("hello world") == [24912, 2375]
    assert count_text("Привет, мир", "gpt-4o") < count_text("Привет, мир", "gpt-4")


def test_a_bundled_file_that_is_not_tiktokens_is_refused(monkeypatch):
    raw = tokens._bundled_file("o200k_base")
    assert raw is not None
    monkeypatch.setattr(tokens, "_bundled_file", lambda name: raw.replace(b"IQ== 0", b"Ig== 0"))
    with pytest.raises(ValueError, match="not the one tiktoken expects"):
        tokens._load_bundled("o200k_base")


def test_the_margin_applies_unless_every_model_counts_exactly(make_settings):
    assert reserve_prompt_tokens(1000, "gpt-4o") == 1000
    assert reserve_prompt_tokens(1000, "gpt-4o", "gpt-4") == 1000
    assert reserve_prompt_tokens(1000, "llama3.1") == int(1000 * PROMPT_MARGIN) + 1
    assert reserve_prompt_tokens(1000, "gpt-4o", "llama3.1") == int(1000 * PROMPT_MARGIN) + 1


def test_estimate_and_a_calls_reservation_use_the_same_margin(make_settings):
    """`estimate`'s worst case and a call's reservation reserve a prompt alike."""
    from examforge.estimate import estimate
    from examforge.llm import LLMClient
    from examforge.syllabus import Chapter, Syllabus

    syllabus = Syllabus(title="T", chapters=[Chapter(id="a", title="A", questions=5)])
    for model, exact in (("gpt-4o-mini", True), ("llama3.1", False)):
        s = make_settings(llm_model=model, llm_price_prompt_per_mtok=1.0,
                          llm_price_completion_per_mtok=0.0, questions_per_call=5)
        est = estimate("t", syllabus, s)
        assert est.calls == 1
        client = LLMClient(s)
        try:
            reserved = client.worst_case_usd(est.prompt_tokens, 0)
        finally:
            client.close()
        assert est.worst_usd == pytest.approx(reserved)
        margin = 1 if exact else PROMPT_MARGIN
        assert reserved == pytest.approx(est.prompt_tokens * margin / 1e6, abs=2e-6)
