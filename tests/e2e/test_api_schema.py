"""schemathesis against the live server's own /openapi.json, over every operation, with the
Bearer token: no 5xx, and no response outside what the spec says (status code, content type,
headers, body). Bounded: a few examples per operation and kind, so it takes seconds.

Each operation is tried three ways: data that fits the spec, data that does not (bad input
must be a 4xx problem, never a 500), and data that fits with its path naming the seeded exam
and run, so the answers carry real rows and their bodies are checked too.

Runs are enqueued to Celery and no worker runs: whatever syllabus and run the fuzzer makes,
nothing calls the model, while every endpoint still reads and writes the real database.

schemathesis's pytest plugin (`schemathesis.pytest.from_fixture`) fails on pytest 9.2 (it sets
the item's `_nodeid`, which pytest no longer has), so its Python API is used: one Hypothesis
test per operation from `APIOperation.as_strategy`, and `Case.call_and_validate` with the
checks named here."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from live_api import LiveApi, serve

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = 15  # per operation and kind of data (150 found nothing more, in 100 s)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
SEEDED = "seeded"


def _seed(api: LiveApi) -> tuple[int, int]:
    """One exam with a run, cancelled at once: its event stream ends (a live run's would not,
    and the fuzzer picks small run ids), while its rows are real; and questions imported into
    its first chapter, so that the review's operations act on a real one. Returns the run's
    id and a question's."""
    from examforge.output import Question

    api.put_exam(SEEDED, [("ch-1", 10), ("ch-2", 5)], title="Seeded exam")
    with api.client() as c:
        resp = c.post(f"/exams/{SEEDED}/runs", json={}, headers={"Idempotency-Key": "seed-run"})
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["id"]
        assert c.post(f"/runs/{run_id}/cancel").status_code == 200
    api.dep.store.import_questions(SEEDED, {"ch-1": [
        Question(f"Seeded question {i}?", (f"a{i}", f"b{i}", f"c{i}", f"d{i}"), 0, "why")
        for i in range(3)]}, "seed")
    with api.client() as c:
        question_id = c.get(f"/exams/{SEEDED}/chapters/ch-1/questions").json()["items"][0]["id"]
    return int(run_id), int(question_id)


def _variants(op: Any, run_id: int,
              question_id: int) -> list[tuple[GenerationMode, dict[str, Any] | None]]:
    names = {p.name for p in op.path_parameters}
    pinned = {k: v for k, v in (("slug", SEEDED), ("run_id", run_id), ("chapter_id", "ch-1"),
                                ("question_id", question_id)) if k in names}
    out: list[tuple[GenerationMode, dict[str, Any] | None]] = [
        (GenerationMode.POSITIVE, None), (GenerationMode.NEGATIVE, None)]
    if pinned:
        out.append((GenerationMode.POSITIVE, pinned))
    return out


def _order(op: Any) -> bool:
    # Starting runs goes last: a run started while the event stream is fuzzed would be live,
    # and its stream would never end.
    return (op.method.upper(), op.path) == ("POST", "/exams/{slug}/runs")


def test_every_operation_answers_inside_its_spec(deploy: Any, mock: Any) -> None:
    api = serve(deploy("sqlite"), API_SSE_HEARTBEAT_S="1")
    run_id, question_id = _seed(api)
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json", headers=api.headers)
    results = list(schema.get_all_operations())
    broken = [r for r in results if not isinstance(r, Ok)]
    assert not broken, broken
    ops = sorted((r.ok() for r in results), key=_order)
    assert len(ops) >= 10, [op.label for op in ops]

    failures: dict[str, str] = {}
    tried = 0
    for op in ops:
        for mode, pinned in _variants(op, run_id, question_id):
            strategy = op.as_strategy(generation_mode=mode, path_parameters=pinned)

            @given(case=strategy)
            @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), database=None)
            def check(case: Any) -> None:
                # The timeout bounds a stream that would not end (none should).
                case.call_and_validate(headers=api.headers, checks=CHECKS, timeout=15)

            try:
                check()
                tried += 1
            except Unsatisfiable:
                # Negative data for an operation that takes none (no parameter, no body).
                assert mode == GenerationMode.NEGATIVE and not op.path_parameters, op.label
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 (schemathesis's FailureGroup, pytest's
                # Failed): every operation is tried, and all failures are reported at the end
                failures[f"{op.label} ({mode.value}{', path ' + str(pinned) if pinned else ''})"] = (
                    f"{type(exc).__name__}: {exc}")
    assert tried >= len(ops) + 5, tried  # negative data exists for the operations with input
    assert not failures, "\n\n".join(f"== {k}\n{v}" for k, v in failures.items())
