"""One frozen settings object, built from the environment and `.env` at the edges.

The CLI and the Celery app call `load_settings()` once and pass the object inward; nothing
deeper reads `os.environ`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from examforge.errors import ConfigError
from examforge.prices import Price, resolve

# The reply's JSON wrapper around its questions, and a margin.
MAX_TOKENS_OVERHEAD = 100


# The drivers examforge installs and tests; SQLAlchemy would accept many more URLs and fail
# later with a traceback about a module that is not installed (MySQLdb, asyncpg, psycopg2).
SUPPORTED_DATABASE_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")
SUPPORTED_DATABASE_URLS = "sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
# Several PostgreSQL servers, the writable one chosen at each connection (issue 34):
# postgresql://USER@HOST1:PORT,HOST2:PORT/DB?target_session_attrs=read-write
# An http(s) URL of a plain form that httpx.URL always accepts (a lower-case host name or a
# dotted IPv4 address without leading zeros, a port below 60000, a path of unreserved
# characters): checked without importing httpx, about a seventh of the start-up of a command
# that reads SQLite (`exams`, `export`). Anything else is checked by httpx itself
# (tests/unit/test_settings.py holds the two to the same answers).
_PLAIN_HTTP_URL = re.compile(
    r"https?://(?:(?:[a-z0-9-]+\.)*[a-z][a-z0-9-]*"
    r"|(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"
    r"(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}))?(?:/[A-Za-z0-9._~/-]*)?")
# Celery's broker is usually Redis; any transport kombu knows is accepted. These are checked
# without importing kombu (a tenth of a second every command would pay).
_COMMON_BROKER_SCHEMES = ("redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp", "memory")


def normalise_database_url(url: str) -> str:
    """Map plain `postgresql://` / `postgres://` URLs onto the psycopg 3 driver, and
    libpq's multi-host form onto SQLAlchemy's (`_multi_host`)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return _multi_host("postgresql+psycopg://" + url[len(prefix):])
    return _multi_host(url) if url.startswith("postgresql+psycopg://") else url


def _multi_host(url: str) -> str:
    """libpq's multi-host URL (`postgresql://u@h1:5432,h2:5432/db?target_session_attrs=
    read-write`, issue 34) as SQLAlchemy reads one: `postgresql+psycopg://u@/db?host=h1:5432&
    host=h2:5432&...`, which psycopg hands to libpq as `host=h1,h2 port=5432,5432`.
    By hand because SQLAlchemy's URL parser reads one host and port (a comma in the port is
    "invalid literal for int()", raised at the first connection), and this is all it lacks."""
    scheme, rest = url.split("://", 1)
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return url
    database, question, query = tail.partition("?")
    params = "&".join(f"host={host}" for host in hosts.split(",") if host)
    return f"{scheme}://{userinfo}{at}/{database}?{params}" + (f"&{query}" if query else "")


def check_database_url(url: str) -> str:
    """`url`, normalised, if examforge can open it; ValueError naming the supported URLs.

    Only the scheme is repeated in the message: the URL may hold a password.
    """
    url = normalise_database_url(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SUPPORTED_DATABASE_SCHEMES:
        what = f"{scheme}:// is not supported" if scheme else "not a database URL"
        raise ValueError(f"{what}: use {SUPPORTED_DATABASE_URLS}")
    if scheme.startswith("sqlite") and not url.split("://", 1)[1].startswith(("/", "?")) \
            and url.split("://", 1)[1]:
        # sqlite://examforge.db reads as a host named examforge.db: SQLAlchemy accepts it
        # here and raises "Invalid SQLite URL" on first use, in every task of a worker.
        raise ValueError(f"{scheme}://{url.split('://', 1)[1]} has two slashes: a SQLite "
                         f"path takes three (sqlite:///relative.db, sqlite:////absolute.db)")
    return url


def is_sentinel_url(url: str) -> bool:
    """Whether BROKER_URL names Redis Sentinels (sentinel://H:P;sentinel://H2:P)."""
    return url.startswith("sentinel://")


def check_broker_url(url: str) -> str:
    """`url` if it names a broker transport kombu knows; ValueError otherwise."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    transport = scheme.split("+", 1)[0]  # kombu's own form: sqla+postgresql://, redis+socket://
    if transport in _COMMON_BROKER_SCHEMES:
        return url
    if transport:
        from kombu.transport import TRANSPORT_ALIASES

        if transport in TRANSPORT_ALIASES:
            return url
    what = f"{scheme}:// is not a broker transport" if scheme else "not a broker URL"
    raise ValueError(f"{what}: use redis://HOST:6379/0")


class Settings(BaseSettings):
    """Every knob, with its unit in its name. Environment names are the field names upper-cased."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", frozen=True)

    broker_url: str = Field(
        "redis://localhost:6379/0",
        description="Celery broker (Redis). Through Redis Sentinel: "
                    "sentinel://HOST:26379;sentinel://HOST2:26379 (every Sentinel, `;` "
                    "between them, as Celery writes it; a password for the master goes in "
                    "the first: sentinel://:PASSWORD@HOST:26379/0), with "
                    "BROKER_SENTINEL_MASTER. The rate limiter and the provider's holds use "
                    "the same Redis. docs/how-to/high-availability.md.")
    # Issue 34: Redis through Sentinel, for the broker (kombu's SentinelChannel), the rate
    # limiter and the holds (redis-py's Sentinel, tasks.broker.broker_redis).
    broker_sentinel_master: str | None = Field(
        None, validate_default=True,
        description="The master's name the Sentinels monitor (their `sentinel monitor NAME "
                    "...`); required with a sentinel:// BROKER_URL, refused with any other.")
    broker_sentinel_password: SecretStr = Field(
        SecretStr(""),
        description="The Sentinels' own password (their requirepass), where it differs from "
                    "the master's (which BROKER_URL carries); empty: the Sentinels ask none.")
    database_url: str = Field(
        "sqlite:///examforge.db",
        description="SQLAlchemy URL; plain postgresql://user@host:port/db works.",
    )
    llm_base_url: str = Field(
        "http://127.0.0.1:8089/v1",
        description="Any OpenAI-compatible endpoint (OpenAI, Ollama's /v1, vLLM, the mock).",
    )
    llm_api_key: SecretStr = Field(SecretStr("sk-mock"), description="Bearer token for the provider.")
    llm_model: str = Field("mock-model", description="Model name sent to the provider.")
    llm_timeout_s: float = Field(
        60.0, gt=0,
        description="Deadline of one model call, from sending the request to the reply's last byte.",
    )
    llm_max_reply_bytes: int = Field(
        4 * 1024 * 1024, ge=1024,
        description="A reply larger than this is cut off and refused (bytes, after decompression).",
    )
    llm_connect_timeout_s: float = Field(5.0, gt=0, description="Connect timeout of one model call.")
    llm_service_tier: Literal["auto", "default", "flex", "priority"] = Field(
        "auto",
        description="service_tier sent with each call to LLM_BASE_URL (OpenAI's processing "
                    "tiers): flex is slower, sometimes refused with a 429, and billed at half "
                    "price; priority is faster and dearer; default is standard processing. "
                    "auto sends no service_tier (OpenAI then applies the project's default "
                    "tier), so a server that knows no tiers is never sent a field it may "
                    "refuse. The fallback endpoint is never sent one. Each call is booked at "
                    "the tier its reply reports.")
    llm_flex_timeout_s: float = Field(
        900.0, gt=0,
        description="Deadline of one call sent with service_tier flex, instead of "
                    "LLM_TIMEOUT_S: flex requests queue, and OpenAI advises 15 minutes.")
    llm_flex_price_factor: float = Field(
        0.5, ge=0, le=10,
        description="A call served at the flex tier costs this times its standard price "
                    "(OpenAI bills flex at its Batch API rates: half the standard price), "
                    "when the price data has no flex price of the model's own.")
    llm_priority_price_factor: float = Field(
        2.0, ge=0, le=10,
        description="A call served at the priority tier costs this times its standard price "
                    "(OpenAI's priority prices are twice the standard ones for the GPT-5 "
                    "family, 1.75x for GPT-4.1), when the price data has no priority price of "
                    "the model's own.")
    llm_json_mode: bool = Field(
        True, description="Deprecated: LLM_JSON_MODE=false is LLM_RESPONSE_FORMAT=none (while "
                          "LLM_RESPONSE_FORMAT is auto); true changes nothing.")
    llm_response_format: Literal["auto", "json_schema", "json_object", "none"] = Field(
        "auto",
        description="response_format sent with each call: json_schema (the question list's "
                    "schema, strict), json_object, or none; auto is json_schema at "
                    "api.openai.com and the bundled mock, json_object elsewhere. A server "
                    "that refuses it (a 400 naming response_format) gets the next one down, "
                    "once per process.")
    llm_temperature: float = Field(0.7, ge=0, le=2)
    llm_price_prompt_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million prompt tokens; unset: the price data's for LLM_MODEL.",
    )
    llm_price_completion_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million completion tokens; unset: the price data's for LLM_MODEL.",
    )
    llm_price_cached_prompt_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million cached prompt tokens (prompt_tokens_details.cached_tokens); "
                    "unset: the price data's cached price of LLM_MODEL, or the prompt price "
                    "when LLM_PRICE_PROMPT_PER_MTOK is set or the data has none.",
    )
    llm_max_tokens_per_question: int = Field(
        400, ge=50, le=20_000,
        description="max_tokens allowance per question asked (the call's worst case for budgets) "
                    "when LLM_MAX_TOKENS_SIZING is fixed, or before the database has history.",
    )
    llm_max_tokens_sizing: Literal["history", "fixed"] = Field(
        "history",
        description="history: size max_tokens from the completion tokens per question this "
                    "database's calls used (p95 of the exam's last 200 used calls, or the "
                    "model's while the exam has fewer than 10), times LLM_MAX_TOKENS_MARGIN, at "
                    "least LLM_MAX_TOKENS_FLOOR and at most LLM_MAX_TOKENS_PER_QUESTION; fixed: "
                    "always LLM_MAX_TOKENS_PER_QUESTION.",
    )
    llm_max_tokens_margin: float = Field(
        1.3, ge=1.0, le=10.0,
        description="Multiplier on the observed p95 completion tokens per question.",
    )
    llm_max_tokens_floor: int = Field(
        50, ge=1, le=20_000,
        description="The least max_tokens allowance per question that history can size.",
    )
    llm_max_tokens_param: Literal["auto", "max_tokens", "max_completion_tokens"] = Field(
        "auto",
        description="Request field for the cap: auto is max_completion_tokens at api.openai.com "
                    "(its reasoning models refuse max_tokens), max_tokens elsewhere.",
    )
    llm_rpm: int | None = Field(None, ge=1, description="Provider's requests per minute, shared.")
    llm_tpm: int | None = Field(None, ge=1, description="Provider's tokens per minute, shared.")
    llm_tpm_counts: Literal["max_tokens", "usage"] = Field(
        "max_tokens",
        description="What the provider charges to TPM: prompt + max_tokens when it admits a "
                    "request (OpenAI), or the real usage (then unused tokens are refunded).",
    )
    llm_rate_burst_s: float = Field(
        1.0, gt=0, le=60,
        description="How much of the rate the shared limiter lets through at once (seconds' worth).",
    )
    llm_fallback_base_url: str | None = Field(
        None,
        description="A second OpenAI-compatible endpoint, used while LLM_BASE_URL is unreachable.",
    )
    llm_fallback_api_key: SecretStr = Field(
        SecretStr(""), description="Bearer token for the fallback (empty: no Authorization header)."
    )
    llm_fallback_model: str | None = Field(None, description="Model at the fallback; default LLM_MODEL.")
    llm_fallback_price_prompt_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million prompt tokens at the fallback; unset: the price data's.",
    )
    llm_fallback_price_completion_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million completion tokens at the fallback; unset: the price data's.",
    )
    llm_fallback_price_cached_prompt_per_mtok: float | None = Field(
        None, ge=0,
        description="USD per million cached prompt tokens at the fallback; unset: as for the primary.",
    )
    llm_fallback_rpm: int | None = Field(None, ge=1, description="The fallback's requests per minute.")
    llm_fallback_tpm: int | None = Field(None, ge=1, description="The fallback's tokens per minute.")
    llm_fallback_hold_s: float = Field(
        60.0, ge=0,
        description="After the primary was unreachable, send calls straight to the fallback this long.",
    )
    llm_unreachable_pause_s: float = Field(
        60.0, gt=0,
        description="An endpoint (and its fallback) that refused or dropped every connection "
                    "this long, across calls, pauses the exam (pause code unreachable), naming "
                    "it; resume once it is back.",
    )
    budget_usd: float | None = Field(
        None, gt=0, allow_inf_nan=False,  # inf would print as Infinity in status --json
        description="Default budget of a new exam (enqueue/run --budget-usd sets one)."
    )
    questions_per_call: int = Field(10, ge=1, le=100, description="Questions asked per model call.")
    slice_questions: int = Field(
        50, ge=1, le=100_000,
        description="Questions per slice: a chapter is cut into slices of at most this many, "
                    "each its own task, so that many workers generate one chapter at once. "
                    "Applies to chapters enqueued (or raised, or regenerated) after it is set.")
    max_questions_per_chapter: int = Field(5000, ge=1, description="Sanity cap on a chapter's count.")
    exams_dir: Path = Field(Path("./exams"), description="Where SLUG/syllabus.json lives.")
    lease_s: float = Field(30.0, gt=0, description="Chapter lease TTL (database clock).")
    group_commit: bool = Field(
        True,
        description="Commit the paid calls' results that a worker process's slots bring at "
                    "once together, in one write transaction (each still fenced by its own "
                    "lease); off: one transaction each.")
    group_commit_wait_ms: float = Field(
        2.0, ge=0, le=50,
        description="The longest a group commit on PostgreSQL waits for replies other slots "
                    "of the process are still preparing (never when none is); 0: no wait. "
                    "SQLite's groups take whoever has queued.")
    group_commit_max: int | None = Field(
        None, ge=1, le=256,
        description="Most commits in one group; unset: 8 on PostgreSQL, 4 on SQLite (a SQLite "
                    "group saves little beyond its BEGIN and COMMIT, and each member waits "
                    "for the whole group: 4 measured faster than 8 and 32 at 2 x 64 threads; "
                    "a PostgreSQL group holds its exams' question-order locks to its end: "
                    "with 16 or 32, other processes' groups timed out behind them).")
    heartbeat_s: float | None = Field(
        None, gt=0, description="Lease renewal interval; default lease_s / 4."
    )
    max_attempts: int = Field(
        8, ge=1, description="Attempts without progress before a chapter is failed."
    )
    max_reasks: int = Field(3, ge=0, description="Re-asks of one batch after invalid model output.")
    near_dup_threshold: float = Field(
        0.5, ge=0.3, le=1.0,
        description="Similarity (Jaccard of normalised content words, 0..1) at which a new "
                    "question is a near-duplicate of a stored one and is rejected and re-asked "
                    "(texts 85 % the same in order, e.g. another spelling, are one "
                    "whatever this says).")
    near_dup_scope: Literal["chapter", "exam", "off"] = Field(
        "chapter",
        description="Where near-duplicates are looked for: the question's chapter, or every "
                    "chapter of its exam (exam: commits of the whole exam queue on one lock); "
                    "off: exact duplicates only, and nothing indexed.")
    avoid_questions: int = Field(
        40, ge=0, le=200,
        description="Stored questions each prompt lists as 'do not repeat' (0: none).")
    steer_prompt: Literal["chapter", "recent"] = Field(
        "chapter",
        description="Which stored questions the prompt lists: chapter (those the model "
                    "repeated most, the newest, and a sample rotating over the whole chapter) "
                    "or recent (the newest only).")
    source_prompt_tokens: int = Field(
        4000, ge=500, le=200_000,
        description="Tokens of course material (a chapter's sources) each prompt may carry: "
                    "the slice's own passages, an even spread of them when they do not fit. "
                    "The material is the same on every call of a slice (the cached prefix).")
    auth_failure_limit: int = Field(
        1, ge=1, description="Consecutive 401/403 replies that pause the exam."
    )
    retry_base_s: float = Field(2.0, gt=0, description="First backoff step for transient errors.")
    retry_max_s: float = Field(120.0, gt=0, description="Backoff ceiling (far below visibility).")
    retry_after_max_s: float = Field(300.0, gt=0, description="Clamp on a provider's Retry-After.")
    db_retry_base_s: int = Field(
        2, ge=1, description="First backoff step of a task whose database was unreachable.")
    db_retry_max_s: int = Field(
        60, ge=1, description="Backoff ceiling of a task whose database was unreachable.")
    visibility_timeout_s: int = Field(
        7200, ge=1, description="Redis redelivery timeout for unacked messages."
    )
    broker_connect_timeout_s: float = Field(
        3.0, gt=0, description="How long the CLI waits for the broker before failing."
    )
    reconcile_interval_s: float = Field(30.0, gt=0, description="Celery beat reconcile period.")
    worker_soft_shutdown_s: float = Field(
        60.0, ge=0, description="On SIGTERM, how long running calls may finish."
    )
    task_queue: str = Field("examforge", description="Celery queue of chapter tasks.")
    worker_prefetch_multiplier: int = Field(
        1, ge=1, le=64,
        description="Messages a worker reserves per thread. Keep 1: a SIGKILLed worker's "
                    "reserved but unstarted messages wait for VISIBILITY_TIMEOUT_S.",
    )
    db_pool_size: int = Field(
        10, ge=1, le=200,
        description="Database connections per process (plus as many in overflow).",
    )

    # The HTTP API (python -m producer serve, issue 11).
    api_tokens: SecretStr = Field(
        SecretStr(""),
        description="Comma-separated bearer tokens the API accepts, each an admin of every "
                    "exam; never logged. Prefer named tokens (`producer token add`), which "
                    "have a role and an exam scope. With neither, serve refuses to start "
                    "unless bound to loopback with --no-auth.",
    )
    api_idempotency_ttl_s: float = Field(
        86400.0, ge=86400.0,
        description="How long an Idempotency-Key of POST /exams/SLUG/runs is remembered "
                    "(at least 24 h, the IETF draft's advice).",
    )
    api_sse_heartbeat_s: float = Field(
        15.0, gt=0, description="Seconds between heartbeat comments of an idle event stream.")
    api_sse_poll_s: float = Field(
        0.5, gt=0, description="Seconds between two reads of the database by an event stream.")
    api_local_concurrency: int = Field(
        8, ge=1, le=512, description="Threads calling the model at once in serve --local.")
    api_sweep_interval_s: float = Field(
        10.0, gt=0, le=3600,
        description="Seconds between two sweeps of every API replica: runs whose work was "
                    "never handed on are launched, and serve --local resumes its runs.")
    api_launch_grace_s: float = Field(
        30.0, gt=0, le=3600,
        description="How long a run's hand-off may take: a sweep launches a run stored this "
                    "long ago and never launched, and a hand-off's claim lapses after it.")
    api_upload_total_bytes: int = Field(
        20_000_000, ge=1, description="The most the sources uploaded for one exam may hold "
                                      "together (bytes); an upload past it is answered 413.")

    # --- batch mode (issue 18; runner.batching, README "Batch mode")
    llm_batch: bool = Field(
        False, description="Generate exams through the provider's Batch API by default "
                           "(enqueue and run; --batch asks for it per exam).")
    llm_batch_discount: float = Field(
        0.5, gt=0, le=1,
        description="What a batch call costs as a share of the synchronous price (OpenAI's "
                    "Batch API: 0.5). Reservations and the ledger use it.")
    batch_poll_s: float = Field(
        60.0, gt=0, le=3600,
        description="Seconds between two batch passes (beat's examforge.batches, and "
                    "`producer run --batch`): submit rounds, poll batches, commit results.")
    batch_max_requests: int = Field(
        50_000, ge=1, le=50_000, description="Requests per batch file (OpenAI's limit: 50,000).")
    batch_max_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, le=200 * 1024 * 1024,
        description="Bytes per batch input file (OpenAI's limit: 200 MB).")
    batch_max_tokens: int | None = Field(
        None, ge=1,
        description="Enqueued tokens an exam's live batches hold together (each line's "
                    "prompt plus its max_tokens): a round gets what the batches in progress "
                    "leave. For a model whose enqueued-token limit a round could exceed "
                    "(OpenAI fails such a batch with token_limit_exceeded after accepting it, "
                    "and the same round would fail again): set it below the limit on your "
                    "limits page. Unset: no cap.")
    batch_lease_s: float = Field(
        # Shorter than the provider's window, a day without a poll (workers stopped) would
        # let another holder claim slices whose batch may still answer: paid twice.
        26 * 3600.0, gt=24 * 3600,
        description="Lease of a submitted batch on its slices, renewed at each poll: longer "
                    "than the provider's 24 h window (required), so no other holder takes "
                    "them while the provider may still answer.")
    batch_submit_lease_s: float = Field(
        300.0, ge=1,
        description="A submitter's lease on a submission while it uploads and creates; a "
                    "submission whose submitter lease lapsed is recovered (listing the "
                    "provider's batches first). Must exceed BATCH_HTTP_TIMEOUT_S.")
    batch_http_timeout_s: float = Field(
        120.0, gt=0, description="Timeout of one Files or Batch API request (upload, create, "
                                 "retrieve, list, download).")
    batch_clock_skew_s: float = Field(
        600.0, ge=0,
        description="How far back of a submission's own time recovery pages the provider's "
                    "batch list (the provider's clock may differ from the database's).")

    # --- verification (issue 20; runner.verify, README "Verification")
    verify: Literal["off", "flag", "replace"] = Field(
        "off",
        description="Blind-solve each new question (its choices reordered, without key or "
                    "explanation) and compare the solver's answer with the key: off; flag "
                    "(disputed questions are stored marked as such); replace (disputed "
                    "questions are withdrawn from the count and the exports, kept for review, "
                    "and replacements are generated up to the target).")
    verify_max_disputed_in_row: int = Field(
        20, ge=1,
        description="Under VERIFY=replace, a slice whose blind solves disputed this many keys "
                    "in a row (counted since the last `resume`) pauses its exam (pause code "
                    "`disputes`): each disputed key is replaced by a paid call, and a solver "
                    "or generator that is always wrong would spend without end. Read by the "
                    "workers.")
    verify_max_disputed_share: float = Field(
        0.8, gt=0, le=1,
        description="Under VERIFY=replace, a slice with at least VERIFY_MAX_DISPUTED_IN_ROW "
                    "keys solved (since the last `resume`) of which more than this share were "
                    "disputed pauses its exam (pause code `disputes`). Read by the workers.")
    verify_model: str | None = Field(
        None, description="The solver's model; default LLM_MODEL.")
    verify_base_url: str | None = Field(
        None, description="The solver's OpenAI-compatible endpoint; default LLM_BASE_URL.")
    verify_api_key: SecretStr = Field(
        SecretStr(""), description="Bearer token for VERIFY_BASE_URL; empty: LLM_API_KEY.")
    verify_price_prompt_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens of the solver; unset: "
                                "LLM_PRICE_* for the same model, else the price data's.")
    verify_price_completion_per_mtok: float | None = Field(
        None, ge=0, description="USD per million completion tokens of the solver (as above).")

    @field_validator("verify_base_url")
    @classmethod
    def _verify_url(cls, v: str | None) -> str | None:
        if not v:
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("verify_model", "verify_price_prompt_per_mtok",
                     "verify_price_completion_per_mtok", mode="before")
    @classmethod
    def _verify_empty(cls, v: object) -> object:
        return None if v == "" else v

    def verify_settings(self) -> "Settings":
        """The settings of the solver's client: LLM_* with VERIFY_MODEL, VERIFY_BASE_URL and
        its key and prices in their place, no fallback, and a reply format of JSON object (the
        questions' schema is not a solve's). Its rate limits are LLM_RPM/LLM_TPM when it
        shares the generation endpoint and model (one shared limiter then), none otherwise."""
        model = self.verify_model or self.llm_model
        base = self.verify_base_url or self.llm_base_url
        same_model = model == self.llm_model
        same = same_model and base.rstrip("/") == self.llm_base_url.rstrip("/")
        key = self.verify_api_key if self.verify_api_key.get_secret_value() else self.llm_api_key
        prompt = self.verify_price_prompt_per_mtok
        completion = self.verify_price_completion_per_mtok
        if prompt is None and completion is None and same_model:
            prompt, completion = self.llm_price_prompt_per_mtok, self.llm_price_completion_per_mtok
        return self.model_copy(update={
            "llm_model": model, "llm_base_url": base, "llm_api_key": key,
            "llm_price_prompt_per_mtok": prompt, "llm_price_completion_per_mtok": completion,
            "llm_price_cached_prompt_per_mtok": (self.llm_price_cached_prompt_per_mtok
                                                 if same_model else None),
            "llm_fallback_base_url": None,
            "llm_response_format": "none" if self.response_format == "none" else "json_object",
            "llm_rpm": self.llm_rpm if same else None, "llm_tpm": self.llm_tpm if same else None,
            "llm_service_tier": self.llm_service_tier if same else "auto",
        })

    @field_validator("llm_base_url", "llm_fallback_base_url")
    @classmethod
    def _http_url(cls, v: str | None, info: ValidationInfo) -> str | None:
        # Checked here, not at the first call: a URL without a scheme would otherwise be a
        # "connection error" retried until every chapter hit its attempt cap. The value is not
        # repeated in the message: a key pasted into the wrong variable would be printed.
        if not v and info.field_name == "llm_fallback_base_url":
            return None  # empty: no fallback
        if _PLAIN_HTTP_URL.fullmatch(v or ""):
            return v
        import httpx

        try:
            url = httpx.URL(v or "")
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        return v

    @field_validator("llm_price_prompt_per_mtok", "llm_price_completion_per_mtok",
                     "llm_fallback_price_prompt_per_mtok",
                     "llm_fallback_price_completion_per_mtok", "llm_price_cached_prompt_per_mtok",
                     "llm_fallback_price_cached_prompt_per_mtok", "llm_rpm", "llm_tpm",
                     "llm_fallback_rpm", "llm_fallback_tpm", "budget_usd", "heartbeat_s",
                     mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        # compose passes `${LLM_RPM:-}` as an empty string when the operator set nothing.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("database_url")
    @classmethod
    def _normalise_db(cls, v: str) -> str:
        return check_database_url(v)

    @field_validator("broker_url")
    @classmethod
    def _broker(cls, v: str) -> str:
        return check_broker_url(v)

    @field_validator("broker_sentinel_master", mode="before")
    @classmethod
    def _sentinel_master(cls, v: object, info: ValidationInfo) -> object:
        # Checked here, not at the first connection: kombu says only "'master_name' transport
        # option must be specified", and the limiter would have no master to ask for.
        v = None if isinstance(v, str) and not v.strip() else v
        url = info.data.get("broker_url")
        if url is None:  # BROKER_URL itself was refused, and is named
            return v
        sentinel = is_sentinel_url(url)
        if sentinel and not v:
            raise ValueError("required with a sentinel:// BROKER_URL: the name the Sentinels "
                             "monitor (sentinel monitor NAME ...)")
        if v and not sentinel:
            raise ValueError("set, but BROKER_URL is not sentinel://: unset it, or list the "
                             "Sentinels in BROKER_URL")
        return v

    @model_validator(mode="after")
    def _check_prices(self) -> "Settings":
        for prefix in ("llm_price", "llm_fallback_price"):
            given = [getattr(self, f"{prefix}_{kind}_per_mtok") is not None
                     for kind in ("prompt", "completion")]
            if any(given) and not all(given):
                # Half a price would silently book the other half at $0.
                raise ValueError(f"{prefix.upper()}_PROMPT_PER_MTOK and "
                                 f"{prefix.upper()}_COMPLETION_PER_MTOK go together: set both")
        return self

    @model_validator(mode="after")
    def _check_timing(self) -> "Settings":
        # A 2 s database stall must not expire a live lease: leave room for four missed beats.
        if self.heartbeat_s is not None and self.heartbeat_s * 4 > self.lease_s:
            raise ValueError("HEARTBEAT_S must be at most LEASE_S / 4")
        if max(self.retry_max_s, self.retry_after_max_s) * 4 > self.visibility_timeout_s:
            # A countdown that long would outlive the unacked message: Redis would redeliver it.
            raise ValueError(
                "RETRY_MAX_S and RETRY_AFTER_MAX_S must stay below VISIBILITY_TIMEOUT_S / 4")
        if self.batch_http_timeout_s * 2 > self.batch_submit_lease_s:
            # A create still waiting for its reply when the submitter's lease lapses would let
            # a recovery list the batches before the create is listed, and create again.
            raise ValueError("BATCH_HTTP_TIMEOUT_S must be at most BATCH_SUBMIT_LEASE_S / 2")
        return self

    @property
    def response_format(self) -> str:
        """LLM_RESPONSE_FORMAT, with the deprecated LLM_JSON_MODE=false read as `none` while
        LLM_RESPONSE_FORMAT is `auto` (compose passes both, each with its default)."""
        if self.llm_response_format == "auto" and not self.llm_json_mode:
            return "none"
        return self.llm_response_format

    def api_token_list(self) -> list[bytes]:
        """The API's accepted tokens, as bytes for hmac.compare_digest (empty: none set)."""
        raw = self.api_tokens.get_secret_value()
        return [t.strip().encode() for t in raw.split(",") if t.strip()]

    @property
    def control_queue(self) -> str:
        """The reconciler's own queue, so a backlog of chapters never delays recovery."""
        return f"{self.task_queue}-control"

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_s / 4

    def price(self, *, fallback: bool = False) -> Price:
        """What a token costs at the primary endpoint, or at the fallback."""
        if fallback:
            return resolve(self.llm_fallback_model or self.llm_model,
                           self.llm_fallback_price_prompt_per_mtok,
                           self.llm_fallback_price_completion_per_mtok,
                           self.llm_fallback_price_cached_prompt_per_mtok,
                           base_url=self.llm_fallback_base_url)
        return resolve(self.llm_model, self.llm_price_prompt_per_mtok,
                       self.llm_price_completion_per_mtok, self.llm_price_cached_prompt_per_mtok,
                       base_url=self.llm_base_url)

    def tier_factor(self, tier: str | None) -> float:
        """What a call served at `tier` costs, as a multiple of its standard price (the price
        data and LLM_PRICE_* are standard prices). `default`, `scale`, a tier this does not
        know and None are 1."""
        if tier == "flex":
            return self.llm_flex_price_factor
        if tier == "priority":
            return self.llm_priority_price_factor
        return 1.0

    def price_at(self, tier: str | None, fallback: bool = False) -> Price:
        """The price of a call served at `tier` (examforge.prices.Price.at_tier): the price
        data's own price for the tier where it has one, else the standard price times the
        tier's factor."""
        return self.price(fallback=fallback).at_tier(tier, self.tier_factor(tier))

    @property
    def service_tier(self) -> str | None:
        """The service_tier sent to the primary endpoint: None for auto (the field is left
        out: OpenAI then applies the project's default tier, and a server that knows no tiers
        is never sent a field it may refuse)."""
        return None if self.llm_service_tier == "auto" else self.llm_service_tier

    @property
    def call_timeout_s(self) -> float:
        """The longest one model call may take with the tier asked for (LLM_FLEX_TIMEOUT_S for
        flex, LLM_TIMEOUT_S otherwise): what waits for calls in flight must wait this long."""
        if self.llm_service_tier == "flex":
            return max(self.llm_flex_timeout_s, self.llm_timeout_s)
        return self.llm_timeout_s

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, *,
                 fallback: bool = False, cached_tokens: int = 0) -> float:
        """What a call cost at the primary endpoint, or at the fallback."""
        return self.price(fallback=fallback).cost_usd(prompt_tokens, completion_tokens,
                                                      cached_tokens)

    def max_tokens(self, questions: int, per_question: int | None = None) -> int:
        """The cap sent with a call asking for `questions`: generous enough that a good reply
        is never cut off (a question is 100-200 tokens in English, two or three times that in
        scripts the tokenizer splits finely), and the call's worst case for budgets.
        `per_question`: the allowance sized from history (examforge.sizing), if any."""
        return MAX_TOKENS_OVERHEAD + questions * (per_question or self.llm_max_tokens_per_question)

    def unpriced_models(self) -> list[str]:
        """Models that would be booked at $0 because no price is known for them."""
        models = [] if self.price().known else [self.llm_model]
        if self.llm_fallback_base_url and not self.price(fallback=True).known:
            models.append(self.llm_fallback_model or self.llm_model)
        return models


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    """Settings from the environment and `.env`; cached for the process.

    Raises ConfigError with one line naming the first bad variable: callers print it as is.
    """
    try:
        return Settings()
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(p) for p in e["loc"]).upper() or "settings"
        msg = str(e["msg"])
        if e["type"] == "value_error":  # pydantic's prefix to a validator's own words
            msg = msg.removeprefix("Value error, ")
        raise ConfigError(f"environment/.env: {field}: {msg}") from None
