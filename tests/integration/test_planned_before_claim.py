"""A first call planned before its claim (Leases.fresh_view, both databases) for a slice the
claim then finds otherwise is planned again from what the claim read, with nothing of the
first plan left over: the item types it counted from the view (nothing stored) and the course
material it sized (none) are the slice's, as the claim read them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from examforge.llm import LLMClient
from examforge.sources import read_material
from examforge.syllabus import Syllabus
from mockllm import MockConfig, MockServer
from runner.pipeline import Runtime, process_chapter

TYPES = {"mcq": 2, "truefalse": 2, "numeric": 2}


def _one_open_slice(url: str) -> Any:
    """A store at `url` with one open slice (chapter a, five questions), disposed after."""
    from storage import Store, connect, migrate

    engine = connect(url)
    migrate(engine)
    store = Store(engine)
    store.sync_exam("ex", Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 5}]}), slice_questions=50)
    yield store
    engine.dispose()


@pytest.fixture
def pg_like_store(db_url: str) -> Any:
    """A store on each database with one open slice."""
    yield from _one_open_slice(db_url)


@pytest.fixture
def sqlite_store_only(sqlite_url: str) -> Any:
    """A SQLite store with one open slice (the general path's claim runs in its group)."""
    yield from _one_open_slice(sqlite_url)


def _run(store: Any, settings: Any, slices: list[tuple[str, int]],
         transport: httpx.BaseTransport | None = None) -> None:
    rt = Runtime.build(settings, store, LLMClient(settings, transport=transport))
    try:
        for chapter_id, slice_no in slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.keeper.stop()
        rt.client.close()


def test_a_rejected_items_replacement_is_of_its_type_when_planned_before_the_claim(
        store: Any, make_settings: Any, db_url: str) -> None:
    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 6, "types": TYPES}]})
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=6, slice_questions=50)
        plan = store.sync_exam("ex", syllabus, slice_questions=50)
        _run(store, settings, plan.slices)
        with store.engine.connect() as conn:
            tf_id = conn.execute(text("SELECT id FROM question WHERE type = 'truefalse' "
                                      "ORDER BY number LIMIT 1")).scalar_one()
        store.reject("ex", tf_id, 1, "test")
        store.sync_exam("ex", syllabus, slice_questions=50)
        # The worker knows the slice as open: its next call is planned before the claim,
        # from a view with nothing stored (six of every type lacking).
        assert store.fresh_view("ex", "a", 0) is not None
        _run(store, settings, [("a", 0)])
    with store.engine.connect() as conn:
        types = conn.execute(text("SELECT type FROM question WHERE number IS NOT NULL"
                                  )).scalars().all()
    assert Counter(types) == TYPES


def _spy_admissions(monkeypatch: Any) -> tuple[list[Any], list[Any]]:
    """The rate-limit admissions the run takes, and those it gives back (LLMClient.cancel)."""
    admitted: list[Any] = []
    cancelled: list[Any] = []
    try_admit, cancel = LLMClient.try_admit, LLMClient.cancel

    def spy_admit(self: LLMClient, *args: Any, **kwargs: Any) -> Any:
        admission = try_admit(self, *args, **kwargs)
        admitted.append(admission)
        return admission

    def spy_cancel(self: LLMClient, admission: Any) -> None:
        cancelled.append(admission)
        cancel(self, admission)
    monkeypatch.setattr(LLMClient, "try_admit", spy_admit)
    monkeypatch.setattr(LLMClient, "cancel", spy_cancel)
    return admitted, cancelled


def _died_after_storing(store: Any, n: int) -> None:
    """A holder of slice a stored `n` multiple-choice items with their verdicts pending (the
    exam verifies), then died: its lease lapsed."""
    from examforge.output import Question
    from storage.store import Claimed, Usage

    doomed = store.claim("ex", "a", "doomed", 30.0, 8)
    assert isinstance(doomed, Claimed)
    call = store.start_call(doomed, 1, n, lease_s=30.0)
    committed = store.commit_batch(doomed, 30.0, call, [
        Question(f"Which of these is option {i} of topic t{i}?", ("a", "b", "c", "d"), 0, "")
        for i in range(n)], model="m", usage=Usage(10, 20, 0.001), verify=True)
    assert committed.stored == n
    with store.engine.begin() as conn:  # the holder is gone: its lease lapsed
        conn.execute(text("UPDATE slice SET lease_expires_at = 0"))


class _Recording(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read().decode())
        return super().handle_request(request)


def test_material_added_after_the_view_was_read_is_in_the_first_prompt(
        store: Any, make_settings: Any, db_url: str) -> None:
    chapters: list[dict[str, Any]] = [{"id": "a", "title": "A", "questions": 4}]
    store.sync_exam("ex", Syllabus.model_validate({"title": "T", "chapters": chapters}),
                    slice_questions=50)
    assert store.fresh_view("ex", "a", 0) is not None  # read without material
    notes = "# One\n\n" + " ".join(f"walrus{k}" for k in range(200))
    chapters[0]["sources"] = ["n.md"]
    plan = store.sync_exam(
        "ex", Syllabus.model_validate({"title": "T", "chapters": chapters}),
        slice_questions=50,
        material={"a": read_material(["n.md"], lambda name: notes.encode(), str)})
    assert plan.slices == [("a", 0)]
    recording = _Recording()
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=4, slice_questions=50)
        _run(store, settings, plan.slices, transport=recording)
    assert recording.bodies and "walrus17" in recording.bodies[0]


def test_a_verifying_takeover_asks_for_the_types_the_slice_lacks_and_lets_the_plan_go(
        store: Any, make_settings: Any, db_url: str, monkeypatch: Any) -> None:
    """A dead holder stored three multiple-choice items, unsolved, under `flag`: the claim
    returns with its blind solves first and no call recorded. The call planned before it, for
    an empty slice, is let go (its admission refunded), and what follows asks for the three
    true/false items the slice lacks, not for an empty slice's mix."""
    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 6, "types": {"mcq": 3, "truefalse": 3}}]})
    store.sync_exam("ex", syllabus, slice_questions=50, default_verify="flag")
    _died_after_storing(store, 3)
    assert store.fresh_view("ex", "a", 0) is not None  # the worker plans before the claim

    admitted, cancelled = _spy_admissions(monkeypatch)
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=6, slice_questions=50)
        _run(store, settings, [("a", 0)])
    assert admitted and any(c is admitted[0] for c in cancelled), \
        "the plan made before the claim was never let go"
    with store.engine.connect() as conn:
        types = conn.execute(text("SELECT type FROM question WHERE number IS NOT NULL"
                                  )).scalars().all()
    assert Counter(types) == {"mcq": 3, "truefalse": 3}


def test_a_claim_run_again_by_its_group_never_takes_the_plan_it_let_go(
        sqlite_store_only: Any, monkeypatch: Any) -> None:
    """The group commit may run a claim again after a rollback. If its first run planned
    again (the slice was not as planned, which lets the first plan go), the run again records
    that plan, whatever it finds: the one let go is never recorded."""
    from storage import leases
    from storage.store import CallPlan, Claimed, FirstCall

    store = sqlite_store_only
    view, fingerprint = store.fresh_view("ex", "a", 0)
    first = FirstCall(CallPlan(view.next_number, 5, prompt_tokens=111, max_tokens=222),
                      fingerprint)
    fits = iter([False, True])  # not as planned in the first run, as planned in the second
    monkeypatch.setattr(leases, "_as_planned", lambda *args: next(fits))
    group_run = store.group.run

    def run_twice(key: Any, work: Any, payload: Any = None, kind: str = "") -> Any:
        try:  # the first run, rolled back as a failed group's is
            with store.engine.begin() as conn:
                work(conn)
                raise RuntimeError("the group's transaction failed")
        except RuntimeError:
            pass
        return group_run(key, work, payload, kind)
    monkeypatch.setattr(store.group, "run", run_twice)
    replans: list[Any] = []

    def replan(v: Any) -> Any:
        replans.append(v)
        return CallPlan(v.next_number, 3, prompt_tokens=7, max_tokens=9)
    claim = store.claim("ex", "a", "w", 30.0, 8, plan_first=replan, first=first)
    assert isinstance(claim, Claimed) and isinstance(claim.first_call, int)
    assert len(replans) == 1
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT requested, prompt_tokens FROM call")).all() == [(3, 7)]


def test_a_verifying_takeover_whose_solves_finish_the_slice_lets_the_plan_go(
        store: Any, make_settings: Any, db_url: str, monkeypatch: Any) -> None:
    """The dead holder's questions fill the slice: its blind solves are all that is left,
    and the run ends after them. The call planned before the claim is let go all the same
    (its rate-limit admission refunded), not left behind with the run."""
    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 4}]})
    store.sync_exam("ex", syllabus, slice_questions=50, default_verify="flag")
    _died_after_storing(store, 4)
    assert store.fresh_view("ex", "a", 0) is not None
    admitted, cancelled = _spy_admissions(monkeypatch)
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=4, slice_questions=50)
        _run(store, settings, [("a", 0)])
        solves = httpx.get(mock.base_url + "/_stats").json()["solves"]
    assert solves >= 1 and len(admitted) == 1, (solves, admitted)  # solved, nothing sent
    assert cancelled and cancelled[0] is admitted[0], "the plan before the claim was kept"


def test_a_plan_no_longer_wanted_is_not_recorded_by_the_claim(pg_like_store: Any) -> None:
    """A worker that starts stopping between planning the first call and claiming: the claim
    records nothing from the plan, and the planner asked inside (which sees the stop) decides;
    otherwise the call would be booked as never sent, a row for nothing."""
    from storage.store import CallPlan, Claimed, FirstCall

    store = pg_like_store
    view, fingerprint = store.fresh_view("ex", "a", 0)
    stopping = [False]
    first = FirstCall(CallPlan(view.next_number, 5, prompt_tokens=111, max_tokens=222),
                      fingerprint, wanted=lambda: not stopping[0])
    stopping[0] = True
    asked: list[Any] = []
    claim = store.claim("ex", "a", "w", 30.0, 8, first=first,
                        plan_first=lambda v: asked.append(v))  # stopping: plans nothing
    assert isinstance(claim, Claimed) and claim.first_call is None and len(asked) == 1
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM call")).scalar_one() == 0


def test_a_limiter_that_said_wait_is_not_asked_again_inside_a_write_transaction(
        sqlite_store_only: Any, make_settings: Any, sqlite_url: str) -> None:
    """The limiter asked to wait when the first call was planned before the claim, and when
    each next call was prepared before its commit: the claim's and the commits' transactions
    (SQLite's one writer) ask it nothing more, and each call is started outside, where the
    limiter is waited for. Three calls, every ask made with the write lock free."""
    import sqlite3

    store = sqlite_store_only
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=sqlite_url, llm_base_url=mock.base_url,
                                 questions_per_call=2, slice_questions=50)
        rt = Runtime.build(settings, store, LLMClient(settings))
        locked: list[bool] = []

        def refused(*_args: Any, **_kwargs: Any) -> None:
            other = sqlite3.connect(store.engine.url.database, timeout=0)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.rollback()
                locked.append(False)
            except sqlite3.OperationalError:
                locked.append(True)
            finally:
                other.close()
            return None  # wait

        rt.client.try_admit = refused  # type: ignore[method-assign]
        try:
            assert process_chapter(rt, "ex", "a", 0).outcome == "done"
        finally:
            rt.keeper.stop()
            rt.client.close()
        assert mock.stats()["calls_total"] == 3
    assert locked and not any(locked), locked
