"""Which process reads each setting, for the generated settings reference (docs/reference/settings.md).

A setting is read by the process that builds its `Settings` and uses the field: setting it
anywhere else changes nothing. The processes:

- `enqueue`: the process that records and enqueues an exam's work: `producer enqueue`,
  `producer run`, and `producer serve` when a client starts a run (`POST /exams/SLUG/runs`).
  What it records on the exam row (`RECORDED_ON_EXAM`) holds for that exam from then on,
  whatever the workers are started with.
- `worker`: a Celery worker running chapter tasks, and the processes that run the same pipeline
  in process: `producer run` and `producer serve --local`.
- `beat`: `celery beat` and the worker on the control queue that runs what it schedules (the
  reconciler, the batch passes; `producer run --batch` runs the passes itself).
- `serve`: the HTTP API, `producer serve`.
- `CLI`: the other commands (`status`, `export`, `doctor`, `prune`, `import`, ...).

tests/unit/test_settings_readers.py fails when a field of `Settings` has no entry here, or an
entry names no field.
"""

from __future__ import annotations

from typing import Literal

Process = Literal["enqueue", "worker", "beat", "serve", "CLI"]
PROCESSES: tuple[Process, ...] = ("enqueue", "worker", "beat", "serve", "CLI")

_ALL: tuple[Process, ...] = PROCESSES
# A model call: the workers' pipeline, and beat's batch passes.
_CALLS: tuple[Process, ...] = ("worker", "beat")
# A price: every call booked, and the estimate of `enqueue --dry-run`.
_PRICED: tuple[Process, ...] = ("enqueue", "worker", "beat")

READ_BY: dict[str, tuple[Process, ...]] = {
    "broker_url": ("enqueue", "worker", "beat", "serve", "CLI"),
    "broker_sentinel_master": ("enqueue", "worker", "beat", "serve", "CLI"),
    "broker_sentinel_password": ("enqueue", "worker", "beat", "serve", "CLI"),
    "database_url": _ALL,
    "llm_base_url": ("worker", "beat", "CLI"),
    "llm_api_key": ("worker", "beat", "CLI"),
    "llm_model": _PRICED,
    "llm_timeout_s": ("worker",),
    "group_commit": ("worker",),
    "group_commit_wait_ms": ("worker",),
    "group_commit_max": ("worker",),
    "llm_max_reply_bytes": ("worker",),
    "llm_connect_timeout_s": _CALLS,
    "llm_service_tier": _PRICED,
    "llm_flex_timeout_s": ("worker",),
    "llm_flex_price_factor": _PRICED,
    "llm_priority_price_factor": _PRICED,
    "llm_json_mode": _CALLS,
    "llm_response_format": _CALLS,
    "llm_temperature": _CALLS,
    "llm_price_prompt_per_mtok": _PRICED,
    "llm_price_completion_per_mtok": _PRICED,
    "llm_price_cached_prompt_per_mtok": _PRICED,
    "llm_max_tokens_per_question": _PRICED,
    "llm_max_tokens_sizing": _CALLS,
    "llm_max_tokens_margin": _CALLS,
    "llm_max_tokens_floor": _CALLS,
    "llm_max_tokens_param": _CALLS,
    "llm_rpm": ("worker",),
    "llm_tpm": ("worker",),
    "llm_tpm_counts": ("worker",),
    "llm_rate_burst_s": ("worker",),
    "llm_fallback_base_url": ("enqueue", "worker"),
    "llm_fallback_api_key": ("worker",),
    "llm_fallback_model": ("enqueue", "worker"),
    "llm_fallback_price_prompt_per_mtok": ("enqueue", "worker"),
    "llm_fallback_price_completion_per_mtok": ("enqueue", "worker"),
    "llm_fallback_price_cached_prompt_per_mtok": ("enqueue", "worker"),
    "llm_fallback_rpm": ("worker",),
    "llm_fallback_tpm": ("worker",),
    "llm_fallback_hold_s": ("worker",),
    "llm_unreachable_pause_s": ("worker",),
    "budget_usd": ("enqueue",),
    "questions_per_call": ("enqueue", "worker", "beat"),
    "slice_questions": ("enqueue", "CLI"),
    "max_questions_per_chapter": ("enqueue", "serve", "CLI"),
    "exams_dir": ("enqueue", "serve", "CLI"),
    "lease_s": ("worker", "serve"),
    "heartbeat_s": ("worker",),
    "max_attempts": ("worker", "beat"),
    "max_reasks": ("worker",),
    "near_dup_threshold": ("worker", "CLI"),
    "near_dup_scope": ("worker", "CLI"),
    "avoid_questions": _CALLS,
    "steer_prompt": ("worker",),
    "source_prompt_tokens": ("enqueue", "worker", "beat"),
    "auth_failure_limit": ("worker",),
    "retry_base_s": _CALLS,
    "retry_max_s": ("worker",),
    "retry_after_max_s": ("worker",),
    "db_retry_base_s": ("worker",),
    "db_retry_max_s": ("worker",),
    "visibility_timeout_s": ("enqueue", "worker", "beat", "serve"),
    "broker_connect_timeout_s": ("enqueue", "serve", "CLI"),
    "reconcile_interval_s": ("beat",),
    "worker_soft_shutdown_s": ("worker",),
    "task_queue": ("enqueue", "worker", "beat", "serve"),
    "worker_prefetch_multiplier": ("worker",),
    "db_pool_size": _ALL,
    "api_tokens": ("serve",),
    "api_upload_total_bytes": ("serve",),
    "api_idempotency_ttl_s": ("serve", "CLI"),
    "api_sse_heartbeat_s": ("serve",),
    "api_sse_poll_s": ("serve",),
    "api_local_concurrency": ("serve",),
    "api_sweep_interval_s": ("serve",),
    "api_launch_grace_s": ("serve",),
    "llm_batch": ("enqueue",),
    "llm_batch_discount": _PRICED,
    "batch_poll_s": ("beat", "serve"),
    "batch_max_requests": ("beat",),
    "batch_max_bytes": ("beat",),
    "batch_max_tokens": ("beat",),
    "batch_lease_s": ("beat",),
    "batch_submit_lease_s": ("beat",),
    "batch_http_timeout_s": ("beat", "CLI"),
    "batch_clock_skew_s": ("beat",),
    "verify": ("enqueue",),
    "verify_max_disputed_in_row": ("worker",),
    "verify_max_disputed_share": ("worker",),
    "verify_model": ("enqueue", "worker"),
    "verify_base_url": ("worker",),
    "verify_api_key": ("worker",),
    "verify_price_prompt_per_mtok": ("enqueue", "worker"),
    "verify_price_completion_per_mtok": ("enqueue", "worker"),
}

# Settings whose value at enqueue is recorded on the exam: the workers read the exam's
# record, not their own environment. `llm_batch` is the default of `--batch`, recorded as the
# exam's mode; `verify` is the default of `enqueue --verify`.
RECORDED_ON_EXAM: frozenset[str] = frozenset({"budget_usd", "llm_batch", "verify"})


def env_name(field: str) -> str:
    """The environment variable (or `.env` key) that sets `field`."""
    return field.upper()
