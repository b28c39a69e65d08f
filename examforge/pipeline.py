"""The plain function behind every chapter task: claim, call, validate, commit.

Celery tasks and the embedded `producer run` both call `process_chapter`; it never raises for
the outcomes of the work itself, it returns a `ChapterResult` saying what happened and when
(if ever) to come back.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from examforge.backoff import backoff_s
from examforge.errors import (
    AuthError,
    DeadlineExceeded,
    LeaseLost,
    OutputInvalid,
    PermanentProviderError,
    ProviderError,
    ReplyTooLarge,
    RetryableProviderError,
)
from examforge.heartbeat import LeaseKeeper
from examforge.llm import Completion, LLMClient
from examforge.output import normalise, parse_questions
from examforge.prompt import build_messages
from examforge.settings import Settings
from examforge.syllabus import Chapter as ChapterSpec
from storage.models import CallOutcome
from storage.store import Claimed, NotClaimed, Store

log = logging.getLogger("examforge.pipeline")


class HandBack(Exception):
    """The process is shutting down: stop between calls and return the chapter to the queue."""


@dataclass(frozen=True)
class ChapterResult:
    """outcome: done | failed | skipped | lost | retry. `retry_in_s` is set for retry."""

    outcome: str
    detail: str = ""
    retry_in_s: float | None = None
    calls: int = 0


@dataclass
class Runtime:
    """What a worker process needs, built once at its edge."""

    settings: Settings
    store: Store
    client: LLMClient
    keeper: LeaseKeeper
    # Set on SIGTERM: running chapters finish the call they are in, commit it, and hand the
    # chapter back instead of starting another call.
    stopping: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def build(cls, settings: Settings, store: Store, client: LLMClient | None = None) -> "Runtime":
        return cls(settings, store, client or LLMClient(settings),
                   LeaseKeeper(store, settings.lease_s, settings.heartbeat_interval_s))


def new_owner() -> str:
    """A fencing token unique to one claim: who holds the lease, and which claim it was."""
    return f"{socket.gethostname()[:60]}/{os.getpid()}/{uuid.uuid4().hex[:16]}"


def process_chapter(rt: Runtime, exam: str, chapter_id: str) -> ChapterResult:
    """Generate whatever the chapter is missing, committing each call's questions as they come."""
    store, settings = rt.store, rt.settings
    store.mark_picked(exam, chapter_id)
    claim = store.claim(exam, chapter_id, new_owner(), settings.lease_s, settings.max_attempts)
    if isinstance(claim, NotClaimed):
        return _not_claimed(claim, exam, chapter_id)
    fields = {"exam": exam, "chapter": chapter_id, "attempt": claim.attempt}
    if claim.took_over_calls:
        log.warning("took over chapter; previous holder's calls marked wasted",
                    extra={**fields, "wasted": claim.took_over_calls})
    lost = rt.keeper.hold(claim.owner)
    run = _Run()
    try:
        _generate(rt, claim, lost, run)
        return ChapterResult("done", calls=run.calls)
    except LeaseLost as exc:
        log.warning("lease lost; result discarded", extra={**fields, "error": str(exc)})
        return ChapterResult("lost", str(exc))
    except HandBack:
        store.release(claim, retry_in_s=0, error="handed back: worker shutting down")
        log.info("handed back on shutdown", extra=fields)
        return ChapterResult("retry", "handed back on shutdown", retry_in_s=0, calls=run.calls)
    except RetryableProviderError as exc:
        # Back off by attempts since the last progress: a chapter that just committed a batch
        # starts again from a short delay.
        streak = 1 if run.committed else claim.attempts_since_progress
        delay = backoff_s(streak, retry_after_s=exc.retry_after_s, rand=random.random(),
                          base_s=settings.retry_base_s, max_s=settings.retry_max_s,
                          retry_after_max_s=settings.retry_after_max_s)
        store.release(claim, retry_in_s=delay, error=f"transient: {exc}")
        log.info("transient failure; retry scheduled",
                 extra={**fields, "error": str(exc), "retry_in_s": round(delay, 2)})
        return ChapterResult("retry", str(exc), retry_in_s=delay)
    except AuthError as exc:
        store.fail(claim, f"auth: {exc}", pause_exam_after=settings.auth_failure_limit)
        log.error("provider rejected the API key", extra={**fields, "error": str(exc)})
        return ChapterResult("failed", f"auth: {exc}")
    except PermanentProviderError as exc:
        store.fail(claim, f"permanent: {exc}")
        return ChapterResult("failed", f"permanent: {exc}")
    except OutputInvalid as exc:
        store.fail(claim, f"invalid output after {settings.max_reasks} re-asks: {exc}")
        return ChapterResult("failed", f"invalid output: {exc}")
    except BaseException as exc:
        # Database down, a bug, a shutdown: hand the chapter back for someone else to take.
        try:
            store.release(claim, retry_in_s=settings.retry_base_s,
                          error=f"{type(exc).__name__}: {exc}")
        except Exception:  # the database itself may be what failed; the lease will expire
            pass
        raise
    finally:
        rt.keeper.drop(claim.owner)


def _not_claimed(claim: NotClaimed, exam: str, chapter_id: str) -> ChapterResult:
    if claim.retry_in_s is not None:
        # Busy (a live lease elsewhere) or in backoff: make no call, check back when it ends.
        log.info("chapter not claimable now; checking back",
                 extra={"exam": exam, "chapter": chapter_id, "reason": claim.reason,
                        "retry_in_s": round(claim.retry_in_s, 2)})
        return ChapterResult("retry", f"{claim.reason}: {claim.detail}",
                             retry_in_s=claim.retry_in_s + 0.5)
    outcome = "failed" if claim.reason == "cap" else "skipped"
    log.info("chapter needs no work here",
             extra={"exam": exam, "chapter": chapter_id, "reason": claim.reason})
    return ChapterResult(outcome, f"{claim.reason} {claim.detail}".strip())


@dataclass
class _Run:
    """What one attempt did so far (read after an exception, too)."""

    calls: int = 0
    committed: int = 0


def _generate(rt: Runtime, claim: Claimed, lost: threading.Event, run: _Run) -> None:
    """Call the model batch by batch until the chapter has its questions."""
    settings, store = rt.settings, rt.store
    spec = ChapterSpec.model_construct(id=claim.chapter_id, title=claim.title,
                                       questions=claim.target, prompt=claim.prompt)
    stored, known = claim.stored, set(claim.known)
    avoid: list[str] = []
    invalid_in_row = 0
    target = claim.target
    while stored < target:
        if rt.stopping.is_set():
            raise HandBack()
        if lost.is_set():
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during the run")
        want = min(settings.questions_per_call, target - stored)
        messages = build_messages(claim.exam, claim.exam_title, spec, want, avoid)
        call_id = store.start_call(claim, stored + 1, want)
        run.calls += 1
        try:
            completion = _call(rt, call_id, messages)
        except ReplyTooLarge as exc:
            # A broken endpoint's reply, not a transient fault: re-asked like invalid output.
            invalid_in_row += 1
            log.warning("reply too large; refused", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "error": str(exc)})
            if invalid_in_row > settings.max_reasks:
                raise OutputInvalid("reply_too_large", str(exc)) from None
            continue
        cost = settings.cost_usd(completion.prompt_tokens, completion.completion_tokens,
                                 fallback=completion.fallback)
        usage: dict[str, Any] = {"prompt_tokens": completion.prompt_tokens,
                                 "completion_tokens": completion.completion_tokens,
                                 "cost_usd": cost, "endpoint": completion.endpoint}
        try:
            parsed = parse_questions(completion.content, completion.finish_reason, want, known)
        except OutputInvalid as exc:
            store.finish_call(call_id, CallOutcome.wasted, f"invalid_output: {exc}"[:500], **usage)
            invalid_in_row += 1
            log.warning("invalid model output", extra={"exam": claim.exam,
                        "chapter": claim.chapter_id, "kind": exc.kind, **usage})
            if invalid_in_row > settings.max_reasks:
                raise
            continue
        if lost.is_set():
            store.finish_call(call_id, CallOutcome.wasted,
                              "lease_lost: lease expired while the call ran", **usage)
            raise LeaseLost(f"lease on {claim.exam}/{claim.chapter_id} lost during the call")
        note = ", ".join(f"{n} {k} rejected" for k, n in parsed.rejected.items())
        committed = store.commit_batch(claim, settings.lease_s, call_id, stored + 1,
                                       parsed.questions, model=completion.model, note=note,
                                       **usage)
        invalid_in_row = 0
        run.committed += len(parsed.questions)
        # The target may have been raised by an enqueue while this chapter ran.
        stored, target = committed.stored, committed.target
        for q in parsed.questions:
            known.add(normalise(q.question))
            avoid.append(q.question)
        log.info("batch committed", extra={"exam": claim.exam, "chapter": claim.chapter_id,
                 "attempt": claim.attempt, "stored": stored, "target": target, **usage})


def _call(rt: Runtime, call_id: int, messages: list[dict[str, str]]) -> Completion:
    try:
        return rt.client.complete(messages)
    except (DeadlineExceeded, ReplyTooLarge) as exc:
        # Sent, and the reply abandoned: the provider may bill it, so it is booked as wasted
        # with our own count of its prompt (no usage came back).
        prompt = exc.prompt_tokens_estimate or 0
        rt.store.finish_call(call_id, CallOutcome.wasted, str(exc), status_code=exc.status_code,
                             prompt_tokens=prompt, endpoint=exc.endpoint,
                             cost_usd=rt.settings.cost_usd(prompt, 0,
                                                           fallback=exc.endpoint == "fallback"))
        raise
    except ProviderError as exc:
        rt.store.finish_call(call_id, CallOutcome.failed, str(exc), status_code=exc.status_code,
                             endpoint=exc.endpoint)
        raise
    except BaseException as exc:
        rt.store.finish_call(call_id, CallOutcome.failed, f"{type(exc).__name__}: {exc}")
        raise
