"""Migration 0023 (question review state, version and question_edit) on both databases:
questions stored before it are unreviewed at version 1 and can be reviewed at once; a
downgrade drops what it added and keeps the questions."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate
from storage.db import alembic_config


def test_0023_over_stored_questions_and_back(db_url: str, tmp_path):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    path = write_syllabus(tmp_path / "exams", "ex", [("c", 3)])
    store.sync_exam("ex", load_syllabus(path, max_questions=1000))
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0022")
    assert "question_edit" not in inspect(engine).get_table_names()
    assert "review" not in {c["name"] for c in inspect(engine).get_columns("question")}
    # Stored by the schema before review: no review columns in the INSERT.
    with engine.begin() as conn:
        for n in (1, 2, 3):
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, created_at) VALUES ('ex', 'c', :n, :q, "
                "'[\"a\", \"b\", \"c\", \"d\"]', 0, 'why', 'm', 1.0)"), {"n": n, "q": f"Q{n}?"})
    migrate(engine)
    items = store.chapter_questions("ex", "c")[1]
    assert [(q["review"], q["version"]) for q in items] == [("unreviewed", 1)] * 3
    store.edit("ex", items[0]["id"], 1, "client", {"question": "Q1, edited?"})
    store.approve("ex", items[1]["id"], 1, "client")
    assert [q["question"] for q in store.iter_questions("ex", approved_only=True)] == ["Q2?"]
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0022")
        texts = [r[0] for r in conn.execute(text(
            "SELECT question FROM question WHERE exam = 'ex' ORDER BY number"))]
    assert texts == ["Q1, edited?", "Q2?", "Q3?"]  # the edited text stays; its history goes
    assert "question_edit" not in inspect(engine).get_table_names()
    migrate(engine)
    engine.dispose()
