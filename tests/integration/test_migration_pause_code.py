"""Migration 0020 (exam.pause_code) on both databases: an exam paused before it gets the code
its pause's text was written with, and what ends the pause follows the code from then on (a
raised budget resumes a budget's pause and nothing else)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from examforge.errors import PauseCode
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate
from storage.db import alembic_config

PAUSES = {
    "b": "budget: the calls settled so far reached the exam's budget; raise it",
    "q": "quota: You exceeded your current quota",
    "a": "auth: HTTP 401 invalid api key",
    "o": "something a person wrote",
}


def test_0020_fills_the_pause_code_from_the_pause_text(db_url: str, tmp_path):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    for slug in [*PAUSES, "live"]:
        path = write_syllabus(tmp_path / "exams", slug, [("c", 2)])
        store.sync_exam(slug, load_syllabus(path, max_questions=1000))
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0019")
        for slug, reason in PAUSES.items():
            conn.execute(text("UPDATE exam SET state = 'paused', pause_reason = :r, "
                              "budget_usd = 1.0 WHERE slug = :s"), {"r": reason, "s": slug})
    migrate(engine)
    codes = {slug: store.status(slug).pause_code for slug in [*PAUSES, "live"]}
    assert codes == {"b": PauseCode.budget, "q": PauseCode.provider, "a": PauseCode.auth,
                     "o": PauseCode.manual, "live": None}
    # A raised budget resumes the budget's pause only; the text is kept for people until then.
    for slug in PAUSES:
        store.set_budget(slug, 5.0)
    states = {slug: store.status(slug).state for slug in PAUSES}
    assert states["b"] != "paused" and store.status("b").pause_code is None
    assert [states[s] for s in "qao"] == ["paused"] * 3
    assert store.status("q").pause_reason == PAUSES["q"]
    engine.dispose()
