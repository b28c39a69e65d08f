"""The price table, its lookups, and the settings that override it."""

from __future__ import annotations

import pytest

from examforge.errors import ConfigError
from examforge.prices import BUILTIN, UNKNOWN, builtin_price, resolve


@pytest.mark.parametrize(("model", "key"), [
    ("gpt-4o-mini", "gpt-4o-mini"),
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ("openai/gpt-4o-mini", "gpt-4o-mini"),
    ("GPT-4o", "gpt-4o"),
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
    ("gpt-4.1-2025-04-14", "gpt-4.1"),
    ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
    ("anthropic/claude-sonnet-4.5", "claude-sonnet-4-5"),
    ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
    ("claude-opus-4-1-20250805", "claude-opus-4-1"),
    ("meta-llama/Llama-3.3-70B-Instruct-Turbo", "meta-llama/llama-3.3-70b-instruct-turbo"),
    ("mock-model", "mock-model"),
])
def test_known_models_and_their_snapshots(model, key):
    price = builtin_price(model)
    assert price is not None and price.known
    assert (price.prompt_per_mtok, price.completion_per_mtok) == BUILTIN[key][:2]
    assert key in price.source


@pytest.mark.parametrize("model", ["llama3.1", "qwen2.5:7b", "my-gateway-alias", "gpt-9", ""])
def test_unknown_models_have_no_price(model):
    assert builtin_price(model) is None
    assert resolve(model, None, None) is UNKNOWN
    assert not UNKNOWN.known and UNKNOWN.cost_usd(1_000_000, 1_000_000) == 0


def test_configured_prices_override_the_table():
    price = resolve("gpt-4o-mini", 1.0, 2.0)
    assert price.cost_usd(1_000_000, 500_000) == pytest.approx(2.0)
    assert price.source == "LLM_PRICE_* settings" and price.known
    # A local model configured at $0 is known to be free: no warning.
    assert resolve("llama3.1", 0.0, 0.0).known


def test_a_price_costs_both_kinds_of_tokens():
    price = builtin_price("gpt-4o-mini")
    assert price is not None
    assert price.cost_usd(2_000_000, 1_000_000) == pytest.approx(2 * 0.15 + 0.60)


def test_settings_use_the_table_unless_both_prices_are_set(make_settings):
    s = make_settings(llm_model="gpt-4o-mini")
    assert s.price().prompt_per_mtok == 0.15 and s.unpriced_models() == []
    s = make_settings(llm_model="llama3.1")
    assert s.unpriced_models() == ["llama3.1"] and s.cost_usd(10**6, 10**6) == 0
    s = make_settings(llm_model="llama3.1", llm_price_prompt_per_mtok=0,
                      llm_price_completion_per_mtok=0)
    assert s.unpriced_models() == []
    s = make_settings(llm_model="mock-model", llm_fallback_base_url="http://x.invalid/v1",
                      llm_fallback_model="llama3.1")
    assert s.unpriced_models() == ["llama3.1"]


def test_half_a_price_is_refused_in_one_line(monkeypatch, tmp_path):
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_PRICE_PROMPT_PER_MTOK", "0.15")
    load_settings.cache_clear()
    with pytest.raises(ConfigError) as info:
        load_settings()
    load_settings.cache_clear()
    assert "set both" in str(info.value) and "\n" not in str(info.value)


def test_an_empty_price_from_compose_means_the_table(monkeypatch, tmp_path):
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("LLM_PRICE_PROMPT_PER_MTOK", "")
    monkeypatch.setenv("LLM_PRICE_COMPLETION_PER_MTOK", "")
    monkeypatch.setenv("LLM_RPM", "")
    load_settings.cache_clear()
    s = load_settings()
    load_settings.cache_clear()
    assert s.price().prompt_per_mtok == 0.15 and s.llm_rpm is None


def test_max_tokens_grows_with_the_questions_asked(make_settings):
    s = make_settings(llm_max_tokens_per_question=300)
    assert s.max_tokens(10) - s.max_tokens(9) == 300
    assert s.max_tokens(1) > 300  # room for the JSON around the questions
