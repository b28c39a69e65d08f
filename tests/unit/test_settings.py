"""Settings come from the environment and .env, under the documented names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from examforge.settings import Settings


@pytest.fixture
def clean_env(monkeypatch):
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)


def test_defaults(clean_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.broker_url == "redis://localhost:6379/0"
    assert s.database_url == "sqlite:///examforge.db"
    assert s.questions_per_call == 10 and str(s.exams_dir) == "exams"


def test_dotenv_and_environment(clean_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(
        "DATABASE_URL=postgresql://me@db:5432/exams\nLLM_API_KEY=sk-from-dotenv\n"
        "QUESTIONS_PER_CALL=7\nLLM_TIMEOUT_S=12.5\nEXAMS_DIR=/data/exams\n")
    monkeypatch.setenv("QUESTIONS_PER_CALL", "3")  # the environment wins over .env
    s = Settings()
    assert s.database_url == "postgresql+psycopg://me@db:5432/exams"
    assert s.llm_api_key.get_secret_value() == "sk-from-dotenv"
    assert "sk-from-dotenv" not in repr(s)
    assert s.questions_per_call == 3 and s.llm_timeout_s == 12.5
    assert str(s.exams_dir) == "/data/exams"


def test_retry_ceiling_must_stay_far_below_the_visibility_timeout(clean_env):
    with pytest.raises(ValidationError, match="RETRY_MAX_S"):
        Settings(_env_file=None, retry_max_s=3000, visibility_timeout_s=3600)


@pytest.mark.parametrize("url", ["localhost:8089/v1", "ftp://host/v1", "http://", "mock",
                                 "http://host:abc/v1", "http://[::1/v1", "sk-live-KEY-pasted-here"])
def test_a_model_url_that_is_not_http_with_a_host_is_refused_at_start(clean_env, url):
    for name in ("llm_base_url", "llm_fallback_base_url"):
        with pytest.raises(ValidationError, match=name) as info:
            Settings(_env_file=None, **{name: url})
        # Exactly this, with no value echoed: it may be a key pasted into the wrong variable.
        assert info.value.errors()[0]["msg"] == (
            "Value error, must be an http:// or https:// URL with a host")


def test_an_empty_fallback_url_means_no_fallback_but_an_empty_primary_is_refused(clean_env):
    assert Settings(_env_file=None, llm_fallback_base_url="").llm_fallback_base_url is None
    assert Settings(_env_file=None, llm_base_url="http://ollama:11434/v1").llm_base_url
    with pytest.raises(ValidationError, match="llm_base_url"):
        Settings(_env_file=None, llm_base_url="")


def test_load_settings_names_the_bad_variable_in_one_line(clean_env, monkeypatch, tmp_path):
    from examforge.errors import ConfigError
    from examforge.settings import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_FALLBACK_BASE_URL", "http://host:abc/v1")
    load_settings.cache_clear()
    try:
        with pytest.raises(ConfigError) as info:
            load_settings()
    finally:
        load_settings.cache_clear()
    assert str(info.value) == ("environment/.env: LLM_FALLBACK_BASE_URL: "
                               "must be an http:// or https:// URL with a host")


@pytest.mark.parametrize("value", ["inf", "nan", "0"])
def test_budget_usd_is_a_finite_amount_above_zero(clean_env, monkeypatch, value):
    # inf would be stored and printed by `status --json` as Infinity, which is not JSON.
    monkeypatch.setenv("BUDGET_USD", value)
    with pytest.raises(ValidationError, match="budget_usd"):
        Settings(_env_file=None)


def test_batch_settings_and_the_create_timeout_below_the_submitter_lease(clean_env):
    s = Settings(_env_file=None, llm_batch="true", batch_poll_s="5")
    assert s.llm_batch is True and s.batch_poll_s == 5 and s.llm_batch_discount == 0.5
    assert s.batch_max_requests == 50_000 and s.batch_max_bytes == 200 * 1024 * 1024
    with pytest.raises(ValidationError, match="BATCH_HTTP_TIMEOUT_S"):
        # A create still waiting for its reply when its submitter's lease lapses would let a
        # recovery list the batches too early and create a second one.
        Settings(_env_file=None, batch_http_timeout_s=200, batch_submit_lease_s=300)
    with pytest.raises(ValidationError):
        Settings(_env_file=None, batch_max_requests=50_001)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8089/v1", "https://api.openai.com/v1", "http://ollama:11434/v1",
    "http://localhost", "http://mock-llm:59999/", "http://0.0.0.0:1/a_b/c~d.e",
    "http://10.255.249.200/v1", "https://a-b.c-d.example/v1/"])
def test_the_model_url_check_without_httpx_accepts_only_what_httpx_accepts(url):
    """A plain URL skips httpx's parse (the import costs a read command a seventh of its
    start-up); what the plain form takes, httpx takes with an http(s) scheme and a host."""
    import httpx

    from examforge.settings import _PLAIN_HTTP_URL

    assert _PLAIN_HTTP_URL.fullmatch(url)
    parsed = httpx.URL(url)
    assert parsed.scheme in ("http", "https") and parsed.host


@pytest.mark.parametrize("url", [
    "http://01.2.3.4/v1", "http://256.1.1.1/", "http://host:65536/", "http://Host/v1",
    "http://host:0/", "http://user@host/", "http://host/v1?x=1", "http://[::1]:8089/v1",
    "http://host/v1 ", "http://host./v1"])
def test_any_other_model_url_is_left_to_httpx(clean_env, url):
    from examforge.settings import _PLAIN_HTTP_URL

    assert not _PLAIN_HTTP_URL.fullmatch(url)
    import httpx

    try:
        parsed: httpx.URL | None = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = None
    valid = parsed is not None and parsed.scheme in ("http", "https") and bool(parsed.host)
    if valid:
        assert Settings(_env_file=None, llm_base_url=url).llm_base_url == url
    else:
        with pytest.raises(ValidationError, match="llm_base_url"):
            Settings(_env_file=None, llm_base_url=url)
