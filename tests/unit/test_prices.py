"""Prices from genai-prices' bundled data, their lookups, and the settings that override them.

The figures below are the ones the hand-written table had (checked 2026-11-30 against the
providers' pages); genai-prices 0.2.3 carries the same for every model the table had, plus the
cached prices this file now checks too."""

from __future__ import annotations

import socket

import pytest

from examforge.errors import ConfigError
from examforge.prices import FREE_MOCK, UNKNOWN, Price, library_price, resolve


@pytest.mark.parametrize(("model", "prompt", "completion", "cached", "found"), [
    ("gpt-4o-mini", 0.15, 0.60, 0.075, "openai/gpt-4o-mini"),
    ("gpt-4o-mini-2024-07-18", 0.15, 0.60, 0.075, "openai/gpt-4o-mini"),
    ("openai/gpt-4o-mini", 0.15, 0.60, 0.075, "gpt-4o-mini"),
    ("GPT-4o", 2.50, 10.00, 1.25, "openai/gpt-4o"),
    ("gpt-4o-2024-08-06", 2.50, 10.00, 1.25, "openai/gpt-4o"),
    ("gpt-4.1", 2.00, 8.00, 0.50, "openai/gpt-4.1"),
    ("gpt-5", 1.25, 10.00, 0.125, "openai/gpt-5"),
    ("gpt-5.5", 5.00, 30.00, 0.50, "openai/gpt-5.5"),  # tiered: the base rate
    ("o4-mini", 1.10, 4.40, 0.275, "openai/o4-mini"),
    ("gpt-3.5-turbo", 0.50, 1.50, None, "openai/gpt-3.5-turbo"),  # no cache discount
    ("claude-sonnet-4-5-20250929", 3.00, 15.00, 0.30, "anthropic/claude-sonnet-4-5"),
    ("claude-3-5-haiku-latest", 0.80, 4.00, 0.08, "anthropic/claude-3-5-haiku"),
    ("claude-opus-4-1-20250805", 15.00, 75.00, 1.50, "anthropic/claude-opus-4-1"),
])
def test_known_models_are_priced_from_genai_prices(model, prompt, completion, cached, found):
    price = resolve(model, None, None)
    assert price.known and price.source.startswith("genai-prices ")
    assert found in price.source
    assert (price.prompt_per_mtok, price.completion_per_mtok) == pytest.approx((prompt, completion))
    assert price.cached_prompt_per_mtok == (None if cached is None else pytest.approx(cached))


@pytest.mark.parametrize(("base_url", "model", "prompt", "completion"), [
    # Open models at the host that names them so: found through the endpoint's URL.
    ("https://api.groq.com/openai/v1", "llama-3.3-70b-versatile", 0.59, 0.79),
    ("https://api.groq.com/openai/v1", "llama-3.1-8b-instant", 0.05, 0.08),
    ("https://api.together.xyz/v1", "meta-llama/Llama-3.3-70B-Instruct-Turbo", 0.88, 0.88),
    ("https://openrouter.ai/api/v1", "anthropic/claude-sonnet-4.5", 3.00, 15.00),
])
def test_a_host_is_found_from_its_base_url(base_url, model, prompt, completion):
    price = resolve(model, None, None, base_url=base_url)
    assert price.known
    assert (price.prompt_per_mtok, price.completion_per_mtok) == pytest.approx((prompt, completion))


@pytest.mark.parametrize("model", ["llama3.1", "qwen2.5:7b", "my-gateway-alias", "gpt-9", ""])
def test_unknown_models_have_no_price(model):
    assert library_price(model, "http://127.0.0.1:8089/v1") is None
    assert resolve(model, None, None, base_url="http://127.0.0.1:8089/v1") is UNKNOWN
    assert not UNKNOWN.known and UNKNOWN.cost_usd(1_000_000, 1_000_000, 500_000) == 0


def test_the_mock_model_is_free_and_known():
    assert resolve("mock-model", None, None) is FREE_MOCK
    assert FREE_MOCK.known and FREE_MOCK.cost_usd(10**6, 10**6, 10**5) == 0


def test_cached_tokens_are_billed_at_the_cached_price():
    """OpenAI counts cached tokens inside prompt_tokens: the rest at the prompt price."""
    price = Price(2.0, 8.0, "test", 0.5)
    assert price.cost_usd(3_000_000, 1_000_000, 1_000_000) == pytest.approx(2 * 2.0 + 0.5 + 8.0)
    # No cached price: no discount. More cached than prompt (a broken usage): the prompt.
    assert Price(2.0, 8.0, "test").cost_usd(10**6, 0, 10**6) == pytest.approx(2.0)
    assert price.cost_usd(10**6, 0, 5 * 10**6) == pytest.approx(0.5)


def test_configured_prices_override_the_data():
    price = resolve("gpt-4o-mini", 1.0, 2.0)
    assert price.cost_usd(1_000_000, 500_000) == pytest.approx(2.0)
    assert price.source == "LLM_PRICE_* settings" and price.known
    # Configured prompt and completion prices and no cached one: no discount assumed.
    assert price.cost_usd(1_000_000, 0, 1_000_000) == pytest.approx(1.0)
    assert resolve("gpt-4o-mini", 1.0, 2.0, 0.1).cost_usd(10**6, 0, 10**6) == pytest.approx(0.1)
    # A cached price alone overrides the data's cached price only.
    price = resolve("gpt-4o-mini", None, None, 0.01)
    assert (price.prompt_per_mtok, price.cached_prompt_per_mtok) == (pytest.approx(0.15), 0.01)
    # A local model configured at $0 is known to be free: no warning.
    assert resolve("llama3.1", 0.0, 0.0).known


def test_a_lookup_never_uses_the_network(monkeypatch):
    """genai-prices can fetch newer prices; examforge reads only the data it bundles."""
    import genai_prices.data_snapshot as snapshot

    def refuse(*_args, **_kwargs):
        raise AssertionError("a price lookup opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    library_price.cache_clear()
    price = resolve("gpt-4.1-mini", None, None, base_url="https://api.openai.com/v1")
    assert price.known and price.cached_prompt_per_mtok == pytest.approx(0.1)
    assert snapshot.get_snapshot() is snapshot._bundled_snapshot()  # no fetched snapshot


def test_settings_use_the_data_unless_both_prices_are_set(make_settings):
    s = make_settings(llm_model="gpt-4o-mini")
    assert s.price().prompt_per_mtok == 0.15 and s.unpriced_models() == []
    assert s.price().cached_prompt_per_mtok == pytest.approx(0.075)
    assert s.cost_usd(10**6, 0, cached_tokens=10**6) == pytest.approx(0.075)
    s = make_settings(llm_model="llama3.1")
    assert s.unpriced_models() == ["llama3.1"] and s.cost_usd(10**6, 10**6) == 0
    s = make_settings(llm_model="llama3.1", llm_price_prompt_per_mtok=0,
                      llm_price_completion_per_mtok=0)
    assert s.unpriced_models() == []
    s = make_settings(llm_model="mock-model", llm_fallback_base_url="http://x.invalid/v1",
                      llm_fallback_model="llama3.1")
    assert s.unpriced_models() == ["llama3.1"]
    s = make_settings(llm_model="mock-model", llm_fallback_base_url="https://api.groq.com/openai/v1",
                      llm_fallback_model="llama-3.1-8b-instant",
                      llm_fallback_price_cached_prompt_per_mtok=0.01)
    assert s.unpriced_models() == [] and s.price(fallback=True).cached_prompt_per_mtok == 0.01


def test_half_a_price_is_refused_in_one_line(monkeypatch, tmp_path):
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_PRICE_PROMPT_PER_MTOK", "0.15")
    load_settings.cache_clear()
    with pytest.raises(ConfigError) as info:
        load_settings()
    load_settings.cache_clear()
    assert "set both" in str(info.value) and "\n" not in str(info.value)


def test_an_empty_price_from_compose_means_the_data(monkeypatch, tmp_path):
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("LLM_PRICE_PROMPT_PER_MTOK", "")
    monkeypatch.setenv("LLM_PRICE_COMPLETION_PER_MTOK", "")
    monkeypatch.setenv("LLM_PRICE_CACHED_PROMPT_PER_MTOK", "")
    monkeypatch.setenv("LLM_RPM", "")
    load_settings.cache_clear()
    s = load_settings()
    load_settings.cache_clear()
    assert s.price().prompt_per_mtok == 0.15 and s.llm_rpm is None
    assert s.price().cached_prompt_per_mtok == pytest.approx(0.075)


def test_max_tokens_grows_with_the_questions_asked(make_settings):
    s = make_settings(llm_max_tokens_per_question=300)
    assert s.max_tokens(10) - s.max_tokens(9) == 300
    assert s.max_tokens(1) > 300  # room for the JSON around the questions
