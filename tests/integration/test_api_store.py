"""The API's tables on both databases: migration 0007 over a 0006 database with rows, the
UNIQUE idempotency key under threads racing in one process, and prune taking an exam's runs."""

from __future__ import annotations

import threading

import pytest
from helpers import seed_at_0006
from sqlalchemy import text

from storage import Store, connect, migrate
from examforge.errors import IdempotencyKeyReused


def test_0007_adds_the_api_tables_keeping_what_is_stored(db_url):
    from storage.db import SCHEMA_REVISION

    engine = connect(db_url)
    with engine.begin() as conn:
        seed_at_0006(conn, title="A", target=2, state="done", attempts=1)
        conn.execute(text(
            "INSERT INTO call (exam, chapter_id, slice_no, attempt, first_number, requested, "
            "worker, outcome, prompt_tokens, completion_tokens, cost_usd, questions_stored, "
            "started_at, reserved_usd, usage_estimated, price_known) VALUES "
            "('ex', 'a', 0, 1, 1, 2, 'w', 'used', 1, 1, 0.5, 2, 1.0, 0, false, true)"))
        for n in (1, 2):
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, call_id, created_at) VALUES "
                "('ex', 'a', :n, :q, '[]', 0, '', 'm', 1, 1)"), {"n": n, "q": f"Q{n}?"})
    migrate(engine)
    store = Store(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == \
            SCHEMA_REVISION  # 0007 and every migration after it
    assert store.status("ex").questions.done == 2
    assert store.stored_syllabus("ex") is None
    run, created = store.create_run("ex", "key", "fp", None)
    assert created and run.call_floor == 1  # the existing call is below the run
    assert store.run_events(run, 0, final=True) == []  # its batch was before the run
    engine.dispose()


def test_threads_racing_one_key_make_one_run(store):
    store.put_syllabus("ex", '{"title": "Ex", "chapters": []}')
    n = 16
    barrier = threading.Barrier(n)
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            barrier.wait()
            run, created = store.create_run("ex", "same", "fp", 1.0)
            results.append((run.id, created))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({rid for rid, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    with pytest.raises(IdempotencyKeyReused):
        store.create_run("ex", "same", "other", 1.0)


def test_put_syllabus_reports_created_once(store):
    assert store.put_syllabus("ex", "{}") is True
    assert store.put_syllabus("ex", '{"a": 1}') is False
    assert store.stored_syllabus("ex") == '{"a": 1}'


def test_0010_adds_the_launch_claim_keeping_the_runs(db_url):
    from alembic import command

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0009")
        for rid, key, launched in ((1, "old", 5.0), (2, "stalled", None)):
            conn.execute(text(
                "INSERT INTO run (id, exam, idempotency_key, fingerprint, call_floor, "
                "launched_at, created_at, updated_at) VALUES "
                "(:id, 'ex', :key, 'fp', 0, :launched, 1, 1)"),
                {"id": rid, "key": key, "launched": launched})
    migrate(engine)
    store = Store(engine)
    assert [(r.id, r.launched_at, r.launching_until) for r in store.exam_runs("ex")] == [
        (2, None, None), (1, 5.0, None)]
    # The run stored and never handed on is found by the sweep and can be claimed; the
    # launched one is neither.
    assert [r.id for r in store.unlaunched_runs(60)] == [2]
    assert not store.claim_launch(1, 30)
    assert store.claim_launch(2, 30)
    assert store.unlaunched_runs(60) == []  # claimed: the sweep leaves it to its holder
    engine.dispose()


class _CountingWork:
    """Work whose hand-off takes a while and counts how often it happened."""

    mode = "celery"

    def __init__(self) -> None:
        self.starts = 0
        self.refuse = threading.Event()
        self.lock = threading.Lock()

    def check(self) -> None:
        from examforge.errors import BrokerUnavailable

        if self.refuse.is_set():
            raise BrokerUnavailable("broker down")

    def start(self, *args: object, **kwargs: object) -> None:
        with self.lock:
            self.starts += 1
        threading.Event().wait(0.2)  # a slow hand-off: the others arrive while it runs

    def resume(self, *args: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_threads_racing_to_launch_one_run_hand_it_on_once(store, make_settings):
    from helpers import wait_for

    from producer.api.context import Context
    from producer.api.runs import launch

    store.put_syllabus("ex", '{"title": "Ex", "chapters": [{"id": "a", "title": "A", '
                             '"questions": 3}]}')
    work = _CountingWork()
    ctx = Context(make_settings(api_launch_grace_s=30), store, work)  # type: ignore[arg-type]
    run, _ = store.create_run("ex", "k", "fp", None)
    # A refused hand-off releases its claim and leaves the run unlaunched.
    work.refuse.set()
    with pytest.raises(Exception, match="broker down"):
        launch(ctx, run)
    assert store.run(run.id).launching_until is None and store.run(run.id).launched_at is None
    work.refuse.clear()
    n = 12
    barrier = threading.Barrier(n)
    won: list[bool] = []

    def race() -> None:
        barrier.wait()
        won.append(launch(ctx, run))

    threads = [threading.Thread(target=race) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False] * (n - 1) + [True]
    assert work.starts == 1
    done = store.run(run.id)
    assert done.launched_at is not None and done.launching_until is None
    assert not launch(ctx, done)  # launched: nothing more
    # A holder that dies keeps others out only until its claim lapses.
    second, _ = store.create_run("ex", "k2", "fp", None)
    assert store.claim_launch(second.id, 0.5)
    assert not launch(ctx, second)
    wait_for(lambda: launch(ctx, second), 10, "the dead holder's claim to lapse")
    assert work.starts == 2


def test_0012_keeps_a_finished_runs_view_and_leaves_older_runs_computed(db_url):
    from alembic import command

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0011")
        conn.execute(text(  # its id from the sequence: PostgreSQL's must move past it
            "INSERT INTO run (exam, idempotency_key, fingerprint, call_floor, state, "
            "launched_at, created_at, updated_at) VALUES ('ex', 'k', 'fp', 0, 'done', 5, 1, 1)"))
    migrate(engine)
    store = Store(engine)
    assert store.run(1).final_view is None  # a run from before keeps its computed view
    store.record_run_state(1, "failed", at=9.0, view='{"state": "done"}')
    run = store.run(1)  # the state stays the first writer's; the view is written once
    assert (run.state, run.final_view) == ("done", '{"state": "done"}')
    store.record_run_state(1, "done", view='{"state": "other"}')
    assert store.run(1).final_view == '{"state": "done"}'
    # Keys are each client's: the run from before is the no-auth client's ('').
    assert store.run(1).client == ""
    mine, made = store.create_run("ex", "k", "fp", None, client="a" * 32)
    assert made and mine.id != 1 and store.create_run("ex", "k", "fp", None)[0].id == 1
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM run WHERE id <> 1"))  # one key, one client, to go down
        command.downgrade(alembic_config(conn), "0011")
        assert conn.execute(text("SELECT state FROM run WHERE id = 1")).scalar() == "done"
    engine.dispose()
