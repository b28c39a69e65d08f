"""Migration 0024 (slice.last_error_code, slice.requeue_code) on both databases: a slice's
last error and last requeue written before it get the code their text was written with, the
prefix moves from the detail to the code, people read the same text as before, and a
downgrade puts the prefixes back."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from examforge.errors import SliceReason
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate
from storage.db import alembic_config

# chapter: (the text an older examforge wrote, its code, the detail kept beside the code)
ERRORS = {
    "t": ("transient: HTTP 503: overloaded", SliceReason.transient, "HTTP 503: overloaded"),
    "h": ("handed back: worker shutting down", SliceReason.handed_back, "worker shutting down"),
    "r": ("rate_limited: HTTP 429", SliceReason.rate_limited, "HTTP 429"),
    "w": ("budget_wait: no room", SliceReason.budget_wait, "no room"),
    "b": ("budget: nothing fits", SliceReason.budget, "nothing fits"),
    "p": ("permanent: HTTP 400", SliceReason.permanent, "HTTP 400"),
    "q": ("quota: HTTP 429: quota", SliceReason.stopped, "quota: HTTP 429: quota"),
    "i": ("invalid output after 3 re-asks: truncated", SliceReason.invalid_output,
          "invalid output after 3 re-asks: truncated"),
    "c": ("attempt cap: 3 attempts without progress; last error: transient: x",
          SliceReason.attempt_cap, "3 attempts without progress; last error: transient: x"),
    "s": ("transient: boom [attempt cap reached]", SliceReason.attempt_cap, "transient: boom"),
    "o": ("OperationalError: it's down", SliceReason.legacy, "OperationalError: it's down"),
}
REQUEUES = {"t": "message_lost: the queue held 3 messages", "h": "something else"}


def _codes(engine):
    with engine.connect() as conn:
        return {r.chapter_id: (r.last_error_code, r.last_error, r.requeue_code, r.requeue_reason)
                for r in conn.execute(text(
                    "SELECT chapter_id, last_error_code, last_error, requeue_code, "
                    "requeue_reason FROM slice WHERE exam = 'ex'"))}


def _before() -> str:
    """The revision 0024 comes after."""
    from alembic.script import ScriptDirectory

    older = ScriptDirectory.from_config(alembic_config()).get_revision("0024").down_revision
    assert isinstance(older, str)
    return older


def test_0024_fills_the_codes_from_the_text_and_a_downgrade_restores_it(db_url: str, tmp_path):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [(c, 2) for c in [*ERRORS, "n"]])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), _before())
        for chapter, (written, _, _) in ERRORS.items():
            conn.execute(text("UPDATE slice SET last_error = :e, last_error_at = 5, "
                              "requeue_reason = :r WHERE chapter_id = :c"),
                         {"e": written, "r": REQUEUES.get(chapter), "c": chapter})
    migrate(engine)
    rows = _codes(engine)
    assert {c: (row[0], row[1]) for c, row in rows.items()} == {
        **{c: (code.value, detail) for c, (_, code, detail) in ERRORS.items()},
        "n": (None, None)}
    assert rows["t"][2:] == ("message_lost", "the queue held 3 messages")
    assert rows["h"][2:] == ("legacy", "something else")
    assert rows["n"][2:] == (None, None)
    # People read what they read before (a reconciler's cap says so first now).
    report = {c.id: c for c in store.status("ex").chapter_list}
    assert {c: report[c].last_error for c in ERRORS} == {
        **{c: e[0] for c, e in ERRORS.items()}, "s": "attempt cap: transient: boom"}
    assert report["t"].requeue_reason == REQUEUES["t"]
    assert report["h"].requeue_reason == REQUEUES["h"]
    assert report["n"].last_error is None and report["n"].last_error_code is None

    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), _before())
    with engine.connect() as conn:
        back = {r.chapter_id: (r.last_error, r.requeue_reason) for r in conn.execute(text(
            "SELECT chapter_id, last_error, requeue_reason FROM slice WHERE exam = 'ex'"))}
    assert {c: back[c][0] for c in ERRORS} == {
        **{c: e[0] for c, e in ERRORS.items()}, "s": "attempt cap: transient: boom"}
    assert back["t"][1] == REQUEUES["t"] and back["h"][1] == REQUEUES["h"]
    migrate(engine)
    engine.dispose()
