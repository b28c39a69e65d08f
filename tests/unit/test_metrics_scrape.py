"""GET /metrics keeps every exam's figures across scrapes and re-reads only the exams that
may have moved (issue 19, producer.api.metrics): each scrape still shows what the rows say
for exams at work, finishing, new or deleted, and a change to a finished exam behind its
back shows after the background full read. SQLite, the data set of bench/history.py."""

from __future__ import annotations

import re

from sqlalchemy import text

from bench.history import build
from helpers import wait_for
from producer.api.metrics import StoreMetrics
from storage import open_store


def _samples(body: bytes) -> dict[str, float]:
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_each_scrape_shows_the_rows_while_reading_only_what_moved(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    build(store.engine, 3, 1)
    metrics = StoreMetrics(store, refresh_s=3600)
    first = _samples(metrics.render())
    active, done = "hist-active-000000", "hist-done-000001"
    assert first[f'examforge_exam_questions_stored{{exam="{active}"}}'] == 400
    assert first[f'examforge_exam_state{{exam="{active}",state="active"}}'] == 1
    assert first['examforge_exams{state="done"}'] == 3
    assert first[f'examforge_exam_calls_total{{exam="{done}",outcome="used"}}'] == 100
    read: list[list[str]] = []
    figures = store.exam_figures
    store.exam_figures = lambda slugs=None: (read.append(list(slugs or ["*"])),  # type: ignore
                                             figures(slugs))[1]
    with store.engine.begin() as conn:
        # The active exam finishes: every open slice done, its calls used.
        conn.execute(text("UPDATE slice SET state = 'done', lease_owner = NULL "
                          "WHERE exam = :e"), {"e": active})
        conn.execute(text("UPDATE call SET outcome = 'used' WHERE exam = :e"), {"e": active})
        conn.execute(text("DELETE FROM call WHERE exam = 'hist-done-000002'"))
        conn.execute(text("DELETE FROM slice WHERE exam = 'hist-done-000002'"))
        conn.execute(text("DELETE FROM exam WHERE slug = 'hist-done-000002'"))
    second = _samples(metrics.render())
    assert read == [[active]]  # the one that was at work; nothing of the finished ones
    assert second[f'examforge_exam_state{{exam="{active}",state="done"}}'] == 1
    assert second[f'examforge_exam_questions_stored{{exam="{active}"}}'] == 1000
    assert second[f'examforge_exam_calls_total{{exam="{active}",outcome="used"}}'] == 50
    assert not [k for k in second if "hist-done-000002" in k]
    assert second['examforge_exams{state="done"}'] == 3
    # A new exam shows at the next scrape; a finished one changed behind its back (a late
    # reply re-booked) only after the full read.
    read.clear()
    build(store.engine, 0, 1, prefix="new")
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE call SET cost_usd = 1.0 WHERE exam = :e AND slice_no = 0 "
                          "AND chapter_id = 'ch0'"), {"e": done})
    third = _samples(metrics.render())
    assert read == [["new-active-000000"]]
    assert third['examforge_exam_questions_stored{exam="new-active-000000"}'] == 400
    cost = f'examforge_exam_cost_usd_total{{exam="{done}"}}'
    assert third[cost] == first[cost]
    # A finished exam whose own row moved (enqueue bumps it when it changes the slices:
    # reopened and finished again between two scrapes) is read again at the next scrape.
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE slice SET target = 5 WHERE exam = 'hist-done-000000' "
                          "AND chapter_id = 'ch0' AND slice_no = 9"))
        conn.execute(text("UPDATE exam SET updated_at = updated_at + 1 "
                          "WHERE slug = 'hist-done-000000'"))
    read.clear()
    fourth = _samples(metrics.render())
    assert read == [["hist-done-000000", "new-active-000000"]]  # and the one at work
    assert fourth['examforge_exam_questions_target{exam="hist-done-000000"}'] == 995
    metrics.refresh_s = 0.0
    metrics.render()  # starts the full read in the background

    def refreshed() -> bool:
        return _samples(metrics.render())[cost] > first[cost]

    wait_for(refreshed, 10, "the full read to show the re-booked cost")
    assert re.search(rb"^# TYPE examforge_exam_calls_total counter$", metrics.render(), re.M)
    store.engine.dispose()
