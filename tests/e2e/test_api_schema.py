"""schemathesis against the live server's own /openapi.json, over every operation, with the
Bearer token: no 5xx, no response outside what the spec says (status code, content type,
headers, body), and the spec is a contract both ways (issue 30): a request it allows is
accepted, one it does not is refused, a required header left out is refused, a method it
does not list is 405 with Allow, and no operation that declares the token works without
one. Bounded: a few examples per operation and kind, so it takes seconds.

Each operation is tried three ways: data that fits the spec, data that does not (bad input
must be a 4xx problem, never a 500), and data that fits with its path naming the seeded exam
and run, so the answers carry real rows and their bodies are checked too; then through
schemathesis's coverage phase (boundaries, types, patterns, missing parameters, methods).

Runs are enqueued to Celery and no worker runs: whatever syllabus and run the fuzzer makes,
nothing calls the model, while every endpoint still reads and writes the real database.

schemathesis's pytest plugin (`schemathesis.pytest.from_fixture`) fails on pytest 9.2 (it sets
the item's `_nodeid`, which pytest no longer has), so its Python API is used: one Hypothesis
test per operation from `APIOperation.as_strategy`, and `Case.call_and_validate` with the
checks named here."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from live_api import TOKEN, LiveApi, serve

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = 8  # per operation and kind of data (150 found nothing more than 15 or 8)
# Every check of schemathesis's that applies to this API: no 5xx; every answer as the document
# declares it; data the document allows is accepted and data it does not is refused; a
# required header left out is refused; a method the document does not list is 405 with
# Allow; and an operation that declares the bearer scheme refuses a request without a token
# or with a wrong one (ignored_auth sends both again for each accepted request).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance,
          positive_data_acceptance, negative_data_rejection, missing_required_header,
          unsupported_method, ignored_auth]
# schemathesis's own expected statuses, less 3xx, 429 and 5xx for valid data (the API neither
# redirects nor limits rates, and not_a_server_error refuses any 5xx), with 413 for invalid
# data (a body over 1 MB is refused before it is read), and with these exceptions:
# - A review action without If-Match is 428 Precondition Required (RFC 6585 made it for
#   exactly this), not one of the 400, 401, 403, 406, 415 or 422 schemathesis expects.
# - Valid data: what JSON Schema cannot state is refused all the same, on four operations
#   only, and their descriptions say it: a syllabus's chapter ids are unique, a difficulty
#   mix adds up to 1, a PDF's first page is not after its last, and `questions` is written 5,
#   not 5.0 (a file's rule too; JSON Schema sees one number) (422); a bulk approve names
#   each question once (400); a source's bytes are a readable file of the type its name
#   says (422: random bytes are no PDF); an export's byte-order mark is for format=csv
#   (422 with another format).
# The token is given as the document's bearer scheme's credentials, so that schemathesis
# sends it as such (and never counts leaving it out as a fault of the request's data).
_ACCEPTED = ["2xx", "401", "403", "404", "409"]
CONFIG = SchemathesisConfig.from_dict({
    "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
    "checks": {
        "missing_required_header": {"expected-statuses": [400, 401, 403, 406, 415, 422, 428]},
        "positive_data_acceptance": {"expected-statuses": _ACCEPTED},
        "negative_data_rejection": {"expected-statuses": [
            400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428]},
    },
    "operations": [
        {"include-path": "/exams/{slug}", "include-method": "PUT", "checks": {
            "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}}},
        {"include-path": "/exams/{slug}/review/approve", "include-method": "POST", "checks": {
            "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "400"]}}},
        {"include-path": "/exams/{slug}/sources/{name}", "include-method": "PUT", "checks": {
            "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}}},
        {"include-path": "/exams/{slug}/export", "include-method": "GET", "checks": {
            "positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}}},
    ],
})
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


def _fresh_key(case: Any) -> None:
    """A new request, a new Idempotency-Key, as the document asks of a client: the same key
    with another request is 422 (the IETF draft's answer), which depends on what was sent
    before, not on the request. Hypothesis repeats its few short keys across requests with
    other bodies and exams, so a valid data's key is made unique here."""
    headers = case.headers or {}
    if case.meta.generation.mode.is_positive and "Idempotency-Key" in headers:
        headers["Idempotency-Key"] = f"k-{uuid.uuid4().hex}"


def _order(op: Any) -> bool:
    # Starting runs goes last: a run started while the event stream is fuzzed would be live,
    # and its stream would never end.
    return (op.method.upper(), op.path) == ("POST", "/exams/{slug}/runs")


def test_every_operation_answers_inside_its_spec(deploy: Any, mock: Any) -> None:
    api = serve(deploy("sqlite"), API_SSE_HEARTBEAT_S="1")
    run_id, question_id = _seed(api)
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json", headers=api.headers,
                                           config=CONFIG)
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
                _fresh_key(case)
                # The timeout bounds a stream that would not end (none should).
                case.call_and_validate(checks=CHECKS, timeout=15)

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

    # schemathesis's coverage phase: every boundary, type, pattern, enum, missing parameter,
    # content type and method the document implies, about a thousand requests, a few
    # seconds. The cases missing_required_header and unsupported_method judge (a required
    # header left out, a method the document does not list) come from it alone, not from the
    # Hypothesis strategies above; every check judges each answer.
    covered: dict[str, int] = {}
    for op in ops:
        for case in _coverage_cases(op):
            label = f"{op.label} (coverage: {_scenario(case)})"
            covered[_scenario(case)] = covered.get(_scenario(case), 0) + 1
            # The coverage phase leaves the bearer scheme's credentials empty ("Bearer "):
            # the token is sent as an explicit header (ignored_auth then takes it for the
            # caller's), but on the cases about the Authorization header itself.
            about_auth = (case.meta.phase.data.parameter or "").lower() == "authorization"
            _fresh_key(case)
            try:
                case.call_and_validate(headers=None if about_auth else api.headers,
                                       checks=CHECKS, timeout=15)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 (as above)
                failures.setdefault(label, f"{type(exc).__name__}: {exc}")
    assert covered.get("unspecified_http_method", 0) >= len(ops), covered
    assert covered.get("missing_parameter", 0) >= 4, covered  # If-Match x3, Idempotency-Key
    assert sum(covered.values()) >= 500, covered
    assert not failures, "\n\n".join(f"== {k}\n{v}" for k, v in failures.items())


def _scenario(case: Any) -> str:
    data = case.meta.phase.data
    return str(getattr(data.scenario, "value", data.scenario))


def _coverage_cases(op: Any) -> list[Any]:
    config = op.schema.config.generation_for(operation=op, phase="coverage")
    return list(op.schema.iter_coverage_cases(
        op, generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        generation_config=config))
