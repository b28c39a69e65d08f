"""Migration 0034 (PostgreSQL): the hot path's SQL functions plan each statement with the
call's values and the tables' current size. Their generic plans, made while an exam's tables
were empty, scanned every question and signature of the exam at each commit; the plans are
read here as PostgreSQL runs them (auto_explain's nested statements, sent to this client as
notices), on an exam that already holds 6,000 questions in other chapters."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import event, text

from examforge.neardup import Checker
from examforge.output import Question
from examforge.syllabus import Syllabus
from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.store import Claimed
from storage.types import Usage

FUNCTIONS = ("ef_claim", "ef_commit", "ef_start_call")


def _configs(engine: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT proname, proconfig FROM pg_proc WHERE proname IN "
            "('ef_claim', 'ef_commit', 'ef_start_call')")).all())


def test_0034_sets_custom_plans_on_the_hot_functions_and_back(pg_url: str) -> None:
    engine = connect(pg_url)
    try:
        migrate(engine)
        assert _configs(engine) == {name: ["plan_cache_mode=force_custom_plan"]
                                    for name in FUNCTIONS}, (
            "CREATE OR REPLACE FUNCTION drops a function's settings: a migration that "
            "recreates ef_claim, ef_start_call or ef_commit calls 0034's custom_plans() after")
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0033")
        assert _configs(engine) == {name: None for name in FUNCTIONS}
        migrate(engine)
        assert set(map(tuple, _configs(engine).values())) == {
            ("plan_cache_mode=force_custom_plan",)}
    finally:
        engine.dispose()


def test_a_commit_reads_its_chapter_not_the_whole_exam(pg_url: str) -> None:
    engine = connect(pg_url)
    notices: list[str] = []

    @event.listens_for(engine, "connect")
    def _explain(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        with dbapi_conn.cursor() as cursor:
            cursor.execute("LOAD 'auto_explain'")
            cursor.execute("SET auto_explain.log_min_duration = 0")
            cursor.execute("SET auto_explain.log_nested_statements = on")
            cursor.execute("SET auto_explain.log_analyze = on")
            cursor.execute("SET auto_explain.log_level = notice")
        dbapi_conn.commit()

    try:
        migrate(engine)
        store = Store(engine)
        chapters = [{"id": f"c{i}", "title": f"C{i}", "questions": 10 if i == 0 else 50}
                    for i in range(121)]
        store.sync_exam("ex", Syllabus.model_validate({"title": "T", "chapters": chapters}),
                        slice_questions=50)
        with engine.begin() as conn:  # 6,000 questions, and their signatures, elsewhere
            conn.execute(text(
                "INSERT INTO question (exam, chapter_id, number, question, choices, "
                "answer_index, explanation, norm_hash, model, created_at) "
                "SELECT 'ex', 'c' || (i / 50 + 1), i % 50 + 1, 'Q' || i, '[\"a\",\"b\",\"c\",\"d\"]',"
                " 0, '', md5(i::text), 'm', 0 FROM generate_series(0, 5999) i"))
            conn.execute(text(
                "INSERT INTO question_sig (question_id, exam, chapter_id, tokens, key_terms, "
                "repeats) SELECT id, exam, chapter_id, '', '', 0 FROM question"))
        # Seven commits, more than the five after which PL/pgSQL would keep a generic plan;
        # the last one's plans are read. Chapter c0 holds nothing yet.
        claim = store.claim("ex", "c0", "w", 30.0, 8)
        assert isinstance(claim, Claimed), claim
        for round_no in range(7):
            call = store.start_call(claim, claim.first_number + round_no, 1, lease_s=30.0)
            notices.clear()
            committed = store.commit_batch(claim, 30.0, call, [Question(
                f"Which option is number {round_no} of topic t{round_no}?",
                ("a", "b", "c", "d"), 0, "")], model="m", usage=Usage(10, 20, 0.001),
                near_dup=Checker())  # NEAR_DUP_SCOPE=chapter, the default
            assert committed.stored == round_no + 1
        plans = "\n".join(notices)
        assert "ef_commit" in plans, plans[:2000]
        removed = [int(line.rsplit(":", 1)[1]) for line in plans.splitlines()
                   if "Rows Removed by Filter" in line]
        assert max(removed, default=0) < 50, plans
        # The duplicate check by the (exam, chapter_id, norm_hash) index; what the scope
        # stored since, by an index that starts with the exam and the chapter.
        assert "uq_question_text" in plans and "ix_question_sig_exam_id" not in plans, plans
    finally:
        engine.dispose()
