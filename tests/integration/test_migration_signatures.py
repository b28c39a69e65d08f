"""Migration 0032 on both databases: the stored near-duplicate signatures, computed by
English rules before it, are recomputed in each chapter's language (its title left out as
before), the exam's index epoch changes so every process rebuilds its band index, and a
Persian question retyped with Arabic letters and other digits is then refused as a repeat
of one stored before the migration."""

from __future__ import annotations

import struct

from alembic import command
from sqlalchemy import select, text, update

from examforge.neardup import Checker, band_keys, signature
from examforge.output import Question
from storage import Store, connect, migrate
from storage.db import alembic_config
from storage.neardup import INDEXES, QS
from storage.store import Claimed, Usage
from test_exam_language import _syllabus

PERSIAN = ["کدام سرویس کش تأخیر خواندن از پایگاه داده را کم می‌کند؟",
           "پورت پیش‌فرض HTTPS در نسخه ۲ کدام است؟"]
RETYPED = "كدام سرويس كش تأخير خواندن از پايگاه داده را كم مي‌كند؟"
ENGLISH = ["Which service caches reads from a database?"]


def _claim(store: Store, chapter: str) -> Claimed:
    claim = store.claim("ex", chapter, "w", 60.0, 8)
    assert isinstance(claim, Claimed)
    return claim


def _commit(store: Store, claim: Claimed, texts: list[str]) -> tuple[str, ...]:
    call = store.start_call(claim, 1, len(texts), lease_s=60.0)
    return store.commit_batch(claim, 60.0, call,
                              [Question(t, ("a", "b", "c", "d"), 0, "") for t in texts],
                              model="m", usage=Usage(1, 1, 0.0), near_dup=Checker()).kept


def _sigs(engine) -> dict[int, tuple[str, str, str, bytes]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return {r.question_id: (r.chapter_id, r.tokens, r.key_terms, bytes(r.bands))
                for r in conn.execute(select(QS))}


def test_0032_recomputes_signatures_in_each_chapter_s_language(db_url: str):
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    try:
        store.sync_exam("ex", _syllabus(), slice_questions=5)  # a: Persian, b: English
        persian = _claim(store, "a")
        assert _commit(store, persian, PERSIAN) == tuple(PERSIAN)
        assert _commit(store, _claim(store, "b"), ENGLISH) == tuple(ENGLISH)
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0031")
            # What 0031's code stored: every signature by English rules.
            for qid, question, chapter in conn.execute(text(
                    "SELECT q.id, q.question, q.chapter_id FROM question q")).all():
                sig = signature(question, "فصل اول" if chapter == "a" else "Chapter b")
                keys = band_keys(sig)
                conn.execute(update(QS).where(QS.c.question_id == qid).values(
                    tokens=sig.encode()[0], key_terms=sig.encode()[1],
                    bands=struct.pack(f"<{len(keys)}Q", *keys)))
        stale = _sigs(engine)
        with engine.connect() as conn:
            epoch = conn.execute(text("SELECT index_epoch FROM exam")).scalar_one()
        migrate(engine)
        after = _sigs(engine)
        with engine.connect() as conn:
            texts = dict(conn.execute(text("SELECT id, question FROM question")).all())
            assert conn.execute(text("SELECT index_epoch FROM exam")).scalar_one() != epoch
        for qid, (chapter, tokens, key_terms, bands) in after.items():
            language, title = ("fa", "فصل اول") if chapter == "a" else ("en", "Chapter b")
            sig = signature(texts[qid], title, language)
            keys = band_keys(sig)
            assert (tokens, key_terms) == sig.encode()
            assert bands == struct.pack(f"<{len(keys)}Q", *keys)
            # English rows were right already and are left as they were; Persian ones move.
            assert (after[qid] == stale[qid]) == (chapter == "b"), qid
        # The migrated bank refuses the Persian question retyped with Arabic letters.
        INDEXES.clear()
        assert _commit(store, persian, [RETYPED]) == ()
    finally:
        engine.dispose()


def test_an_import_signs_in_the_chapter_s_language(db_url: str):
    """`producer import` into a Persian chapter: a line that retypes a stored question with
    Arabic letters and writes its number in Persian digits, or a later line that repeats an
    earlier one with a ZWNJ written as a space, is a near-duplicate; a question on another
    number is not."""
    engine = connect(db_url)
    migrate(engine)
    store = Store(engine)
    try:
        store.sync_exam("ex", _syllabus(), slice_questions=5)
        store.import_questions("ex", {"a": [Question(PERSIAN[0], ("a", "b", "c", "d"), 0, "")]},
                               "first.jsonl", near_dup=Checker())
        lines = [
            "كدام سرويس كش تأخير خواندن از پايگاه داده را كم مي‌كند؟",  # stored, retyped
            "پورت پیش‌فرض HTTPS در نسخه 2 کدام است؟",
            "پورت پیش فرض HTTPS در نسخه ۲ کدام است؟",  # the line before, written apart
            "پورت پیش‌فرض HTTPS در نسخه 3 کدام است؟",  # another fact
        ]
        result = store.import_questions(
            "ex", {"a": [Question(t, ("a", "b", "c", "d"), 0, "") for t in lines]}, "f.jsonl",
            near_dup=Checker())
        [chapter] = result.chapters
        assert (chapter.imported, chapter.near_duplicates) == (2, 2)
    finally:
        engine.dispose()
