"""Batch mode under an adversarial review: the promises docs/how-to/batch-and-flex.md makes,
tried against providers and timings the happy path does not meet."""

from __future__ import annotations

from typing import Any

import pytest

from runner.batching import run_pass
from helpers import wait_for
from storage.models import BatchState
from test_batch_mode import (_custom_ids, _paid_batch_lines, _provider_batches, _rows, _setup,
                             _until_done, rt_of)  # noqa: F401  (rt_of: a fixture)


class _NoMetadata:
    """A provider (or gateway) that accepts a batch's metadata and never gives it back."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def page(self, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        page = self._api.page(after, limit)
        for batch in page.get("data") or []:
            batch["metadata"] = None
        return page

    def batches_since(self, since: float):
        # The real paging, over this page().
        return type(self._api).batches_since(self, since)


def test_a_provider_that_drops_metadata_never_gets_a_second_create(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # The create makes the batch and its reply is lost; the listing cannot match metadata.
    mock_llm.configure(batch_create_lost=1)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=4.0, batch_http_timeout_s=2.0)
    rt = rt_of(settings, store)
    rt.api = _NoMetadata(rt.api)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.creating.value and row.provider_batch_id is None
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[0].provider_batch_id)[1],
             20, "the recovery to record a batch")
    (row,) = store.exam_batches("bx")
    assert row.create_attempts == 1  # adopted by its file, never created again
    batches = _provider_batches(mock_llm)
    assert [b["id"] for b in batches] == [row.provider_batch_id]
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 5 and [c.outcome for c in calls] == ["used"]
    assert len(_paid_batch_lines(mock_llm)) == 1


class _FrozenCreate:
    """A submitter frozen (a GC pause, SIGSTOP, a VM migration) between recording `creating`
    and sending its create: the create reaches the provider after its lease lapsed."""

    def __init__(self, api: Any) -> None:
        import threading

        self._api = api
        self.resume = threading.Event()
        self.created: list[dict[str, Any]] = []
        self.refused: list[Exception] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def create(self, input_file_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        from examforge.errors import ProviderError

        assert self.resume.wait(30)
        try:
            batch = self._api.create(input_file_id, metadata)
        except ProviderError as exc:
            self.refused.append(exc)
            raise
        self.created.append(batch)
        return batch


def _batches_of_each_custom_id(mock: Any) -> dict[str, set[str]]:
    """Every line the mock ran (paid or not), by custom_id: the batches it ran in."""
    ran: dict[str, set[str]] = {}
    for use in mock.usage():
        if use.get("batch"):
            ran.setdefault(use["custom_id"], set()).add(use["batch_id"])
    return ran


def _paid_unbooked(mock: Any, store: Any) -> list[str]:
    calls, _, _ = _rows(store)
    booked = {f"call-{c.id}" for c in calls if c.outcome in ("used", "wasted")}
    return [u["custom_id"] for u in _paid_batch_lines(mock) if u["custom_id"] not in booked]


def _frozen_then_recovered(make_settings, db_url, mock_llm, tmp_path, rt_of, *,
                           cancel: bool):
    """A submitter frozen before its create while another pass recovers the submission
    (cancelled first when `cancel`); the frozen one then wakes and sends its create."""
    import threading

    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=4.0, batch_http_timeout_s=2.0)
    frozen = rt_of(settings, store)
    frozen.api = _FrozenCreate(frozen.api)
    other = rt_of(settings, store)
    thread = threading.Thread(target=run_pass, args=(frozen, ["bx"]))
    thread.start()
    try:
        wait_for(lambda: store.exam_batches("bx") and
                 store.exam_batches("bx")[0].state == BatchState.creating.value,
                 20, "the frozen submitter to record `creating`")
        (row,) = store.exam_batches("bx")
        if cancel:
            store.request_batch_cancel("bx")
        ended = BatchState.abandoned.value if cancel else BatchState.submitted.value
        wait_for(lambda: (run_pass(other, ["bx"]), store.batch(row.id).state == ended)[1],
                 20, f"the recovery to leave the submission {ended}")
    finally:
        frozen.api.resume.set()
        thread.join(30)
    assert not thread.is_alive()
    return settings, store, frozen, other, row


def test_a_frozen_submitters_late_create_is_refused_after_a_recovery_created_again(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # The recovery lists nothing, deletes the submission's file, lists again, uploads the
    # lines under a new file and creates with it. The frozen submitter's create names the
    # deleted file: refused, so no custom_id runs in two batches and nothing is paid twice.
    settings, store, frozen, other, row = _frozen_then_recovered(
        make_settings, db_url, mock_llm, tmp_path, rt_of, cancel=False)
    assert frozen.api.created == [] and len(frozen.api.refused) == 1
    assert frozen.api.refused[0].status_code == 404  # type: ignore[attr-defined]
    now = store.batch(row.id)
    assert now is not None and now.input_file_id != row.input_file_id
    assert now.create_attempts == 2  # the frozen one's (refused), then the recovery's
    report = store.status("bx")
    assert report.state != "paused", report.pause_reason  # a refusal of a taken-over create
    _until_done(other)
    batches = _provider_batches(mock_llm)
    assert [b["id"] for b in batches] == [store.batch(row.id).provider_batch_id]
    assert batches[0]["input_file_id"] == now.input_file_id
    ran = _batches_of_each_custom_id(mock_llm)
    assert ran and all(len(ids) == 1 for ids in ran.values()), ran
    assert _paid_unbooked(mock_llm, store) == []
    calls, questions, _ = _rows(store)
    assert len(questions) == 5 and [c.outcome for c in calls] == ["used"]
    assert len(_paid_batch_lines(mock_llm)) == 1


def test_a_frozen_submitters_late_create_is_refused_after_its_submission_was_abandoned(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # Cancelled while the submitter is frozen: the recovery lists, deletes the file, lists
    # again, finds nothing and abandons the submission (calls booked not sent, slices given
    # back). The late create names the deleted file: refused, so no batch of those calls
    # is ever paid and left unbooked.
    settings, store, frozen, other, row = _frozen_then_recovered(
        make_settings, db_url, mock_llm, tmp_path, rt_of, cancel=True)
    assert frozen.api.created == [] and len(frozen.api.refused) == 1
    assert store.batch(row.id).state == BatchState.abandoned.value
    assert store.status("bx").state != "paused"
    # The slices went back: a later round (its own submission, new calls) does them.
    assert not [b for b in _provider_batches(mock_llm)
                if (b.get("metadata") or {}).get("examforge_submission") == row.id]
    _until_done(other)
    calls, questions, _ = _rows(store)
    first = calls[0]
    assert (first.outcome, first.cost_usd) == ("failed", 0.0)  # booked not sent
    assert f"call-{first.id}" not in _batches_of_each_custom_id(mock_llm)
    ran = _batches_of_each_custom_id(mock_llm)
    assert all(len(ids) == 1 for ids in ran.values()), ran
    assert _paid_unbooked(mock_llm, store) == []
    assert len(questions) == 5


class _Unanswered:
    """A create that times out before it reaches the provider: sent maybe, as far as the
    submitter knows. Keeps what it would have sent, for a test to send it later."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.held: list[tuple[str, dict[str, str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def create(self, input_file_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        from examforge.errors import ErrorKind, RetryableProviderError

        self.held.append((input_file_id, metadata))
        err = RetryableProviderError("POST batches: timeout: ReadTimeout")
        err.kind = ErrorKind.timeout
        raise err


class _CreateLandsAtDelete:
    """The held create reaches the provider after the recovery's first listing, right before
    its delete of the file: only the second listing can see it."""

    def __init__(self, api: Any, held: list[tuple[str, dict[str, str]]]) -> None:
        self._api, self.held = api, held
        self.landed: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def delete_file(self, file_id: str) -> bool:
        while self.held:
            self.landed.append(self._api.create(*self.held.pop()))
        self.deleted.append(file_id)
        return self._api.delete_file(file_id)


def test_a_create_landing_between_the_listing_and_the_delete_is_adopted_not_duplicated(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=4.0, batch_http_timeout_s=2.0)
    submitter = rt_of(settings, store)
    submitter.api = _Unanswered(submitter.api)
    run_pass(submitter, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.creating.value and len(submitter.api.held) == 1
    recovery = rt_of(settings, store)
    recovery.api = _CreateLandsAtDelete(recovery.api, submitter.api.held)
    wait_for(lambda: (run_pass(recovery, ["bx"]), store.batch(row.id).provider_batch_id)[1],
             20, "the recovery to record a batch")
    (late,) = recovery.api.landed
    assert recovery.api.deleted == [row.input_file_id]
    now = store.batch(row.id)
    assert now.provider_batch_id == late["id"]  # adopted by the second listing
    assert now.create_attempts == 1 and now.input_file_id == row.input_file_id  # no new file
    assert [b["id"] for b in _provider_batches(mock_llm)] == [late["id"]]
    _until_done(recovery)
    ran = _batches_of_each_custom_id(mock_llm)
    assert ran and all(ids == {late["id"]} for ids in ran.values()), ran
    assert _paid_unbooked(mock_llm, store) == []
    calls, questions, _ = _rows(store)
    assert len(questions) == 5 and [c.outcome for c in calls] == ["used"]


def test_booking_a_large_batch_keeps_the_submission_from_a_second_poller(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # Booking 50,000 lines takes longer than the submitter's lease: another worker's pass
    # must not take the submission and book the same batch at the same time (its release of
    # the slices would throw away the lines the first one has not committed yet).
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path,
                             [(c, 5) for c in "abcde"], batch_submit_lease_s=4.0,
                             batch_http_timeout_s=2.0)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.submitted.value and row.requests == 5
    intruder: list[Any] = []
    real_commit = store.commit_batch

    def slow_commit(*args: Any, **kwargs: Any) -> Any:
        wait_for(lambda: store.now() >= slow_commit.until, 10, "a slow commit", interval_s=0.05)
        slow_commit.until = store.now() + 1.2
        if len(intruder) < 1 and store.now() > slow_commit.start + 4.5:
            intruder.append(store.take_submission(row.id, "intruder", 4.0))
        return real_commit(*args, **kwargs)

    slow_commit.until = slow_commit.start = 0.0
    wait_for(lambda: mock_llm_batch_done(mock_llm, row.id), 30, "the provider's batch to end")
    slow_commit.start = slow_commit.until = store.now()
    store.commit_batch = slow_commit  # type: ignore[method-assign]
    try:
        run_pass(rt, ["bx"])
    finally:
        store.commit_batch = real_commit  # type: ignore[method-assign]
    assert intruder == [None], "a second poller took a submission still being booked"
    calls, questions, _ = _rows(store)
    assert len(questions) == 25 and [c.outcome for c in calls] == ["used"] * 5


def mock_llm_batch_done(mock: Any, submission: str) -> bool:
    return any((b.get("metadata") or {}).get("examforge_submission") == submission
               and b["status"] == "completed" for b in _provider_batches(mock))


class _Refusing:
    """A provider that refuses every create (or upload) with the same 4xx: a model without
    batch support, a key without the Batch API. Retrying cannot fix it."""

    def __init__(self, api: Any, step: str, status: int, body: dict[str, Any]) -> None:
        import httpx

        self._api, self.step, self.sent = api, step, 0
        self._response = httpx.Response(status, json=body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def _refuse(self, path: str) -> None:
        self.sent += 1
        raise self._api._error("POST", path, self._response)

    def upload(self, filename: str, content: bytes) -> str:
        if self.step == "upload":
            self._refuse("files")
        return self._api.upload(filename, content)

    def create(self, input_file_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        if self.step == "create":
            self._refuse("batches")
        return self._api.create(input_file_id, metadata)



@pytest.mark.parametrize("step,status,body", [
    ("create", 400, {"error": {"message": "The model does not support the Batch API.",
                               "type": "invalid_request_error", "code": "invalid_value"}}),
    ("upload", 401, {"error": {"message": "Incorrect API key provided.",
                               "type": "invalid_request_error", "code": "invalid_api_key"}}),
])
def test_a_refusal_that_retrying_cannot_fix_pauses_the_exam(
        make_settings, db_url, mock_llm, tmp_path, rt_of, step, status, body):
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             retry_base_s=0.01)
    rt = rt_of(settings, store)
    rt.api = _Refusing(rt.api, step, status, body)
    wait_for(lambda: (run_pass(rt, ["bx"]), rt.api.sent >= 2
                      or store.status("bx").state == "paused")[1], 20,
             "the refusal to pause the exam, or be sent again")
    run_pass(rt, ["bx"])
    assert rt.api.sent == 1, f"a refused {step} was sent again"
    report = store.status("bx")
    assert report.state == "paused" and str(status) in (report.pause_reason or "")
    calls, questions, _ = _rows(store)
    assert [(c.outcome, c.cost_usd) for c in calls] == [("failed", 0.0)] and not questions


def test_a_create_refused_for_the_enqueued_token_limit_is_retried_never_paused(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    """A provider or gateway that refuses the create itself (rather than failing the batch
    after accepting it) for the model's enqueued-token limit: retryable, a later round sends
    the calls again, the exam is never paused."""
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             retry_base_s=0.01, retry_max_s=0.05)
    rt = rt_of(settings, store)
    api = rt.api
    rt.api = _Refusing(api, "create", 400, {"error": {
        "message": "Enqueued token limit reached for mock-model in organization org-x.",
        "type": "invalid_request_error", "code": "token_limit_exceeded"}})
    wait_for(lambda: (run_pass(rt, ["bx"]), rt.api.sent >= 2)[1], 20,
             "the refused create to be retried in a later round")
    assert store.status("bx").state != "paused"
    rt.api = api
    _until_done(rt)
    calls, questions, _ = _rows(store)
    refused = [c for c in calls if c.outcome == "failed"]
    assert len(refused) >= 2 and all(c.cost_usd == 0 for c in refused)
    assert len(questions) == 5 and [c.outcome for c in calls].count("used") == 1


def test_a_second_batch_with_the_submissions_metadata_is_cancelled_at_recovery(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # The create's reply is lost, and the provider (a gateway retrying the create, an SDK's
    # own retry) made two batches of the same file: the recovery adopts one and cancels the
    # other, which would pay every line twice.
    mock_llm.configure(batch_create_lost=1, batch_validation_s=60)
    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5)],
                             batch_submit_lease_s=4.0, batch_http_timeout_s=2.0)
    rt = rt_of(settings, store)
    run_pass(rt, ["bx"])
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.creating.value
    rt.api.create(row.input_file_id, {"examforge_submission": row.id})  # the duplicate
    wait_for(lambda: (run_pass(rt, ["bx"]), store.exam_batches("bx")[0].provider_batch_id)[1],
             20, "the recovery to adopt a batch")
    (row,) = store.exam_batches("bx")
    ours = [b for b in _provider_batches(mock_llm)
            if (b.get("metadata") or {}).get("examforge_submission") == row.id]
    assert len(ours) == 2
    others = [b for b in ours if b["id"] != row.provider_batch_id]
    assert [b["status"] for b in others] in (["cancelling"], ["cancelled"])


def test_a_submitter_frozen_while_claiming_leaves_no_slice_held_after_its_abandon(
        make_settings, db_url, mock_llm, tmp_path, rt_of):
    # Frozen between two claims past its lease: a recovery abandons the submission (its
    # calls so far booked not sent, its slices given back). The submitter wakes and claims
    # one more slice for a submission nobody will ever advance: that slice must not stay held
    # for BATCH_LEASE_S (a day) and then have its never-sent call booked at its worst case.
    from runner.batching import PassResult, _advance
    from storage import open_store

    settings, store = _setup(make_settings, db_url, mock_llm, tmp_path, [("a", 5), ("b", 5)],
                             batch_submit_lease_s=1.0, batch_http_timeout_s=0.5)
    rt = rt_of(settings, store)
    other = rt_of(settings, open_store(settings.database_url))
    real_claim = store.claim
    claims = []

    def claim(*args: Any, **kwargs: Any) -> Any:
        claims.append(args)
        if len(claims) == 2:  # frozen here, past the submitter's lease
            (row,) = store.live_batches("bx")
            wait_for(lambda: store.now() > row.lease_expires_at, 10, "the lease to lapse",
                     interval_s=0.05)
            _advance(other, row, PassResult())
            assert store.batch(row.id).state == BatchState.abandoned.value
        return real_claim(*args, **kwargs)

    store.claim = claim  # type: ignore[method-assign]
    try:
        run_pass(rt, ["bx"])
    finally:
        store.claim = real_claim  # type: ignore[method-assign]
    (row,) = store.exam_batches("bx")
    assert row.state == BatchState.abandoned.value
    assert store.held_slices(row.owner) == []
    calls, _, _ = _rows(store)
    assert [c.outcome for c in calls if c.outcome == "in_flight"] == []
    _until_done(rt)
    calls, questions, _ = _rows(store)
    assert len(questions) == 10
    assert not [c for c in calls if c.reason == "crash_before_commit"]
