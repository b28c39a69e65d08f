"""One normal form (NFKC, format characters removed, whitespace collapsed) for the exact hash
and the near-duplicate signatures, on SQLite and the real PostgreSQL: variants of a stored
question are stored once through the commit and the import, with near-duplicate checks on
and off; migration 0013 recomputes the stored hashes and signatures over rows, including
two stored questions that the new form makes equal."""

from __future__ import annotations

import hashlib
import logging
import struct
import unicodedata

import pytest
from helpers import write_syllabus
from sqlalchemy import select, text

from examforge.neardup import Checker, band_keys, signature
from examforge.output import Question, normalise, text_hash
from examforge.syllabus import load_syllabus
from storage import Store, connect, migrate
from storage.base import Q
from storage.neardup import QS
from storage.store import Claimed, Usage

BASE = "Which AWS service caches the café's static website assets at edge locations?"
NFC = unicodedata.normalize("NFC", BASE)
VARIANTS = {
    "NFD": unicodedata.normalize("NFD", BASE),
    "full-width": BASE.replace("AWS", "ＡＷＳ"),
    "zero-width space in a word": BASE.replace("AWS", "A\u200bWS"),
    "soft hyphen": BASE.replace("locations", "loca\u00adtions"),
    "doubled spaces": BASE.replace(" static ", "  static  "),
}


def _q(t: str) -> Question:
    return Question(t, ("a", "b", "c", "d"), 0, "")


def _sync(store: Store, tmp_path, chapters, slice_questions: int = 50) -> None:  # type: ignore[no-untyped-def]
    path = write_syllabus(tmp_path / "exams", "ex", chapters)
    store.sync_exam("ex", load_syllabus(path, max_questions=1000),
                    slice_questions=slice_questions)


def _texts(store: Store, chapter: str = "a") -> list[str]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(Q.c.question).where(
            Q.c.exam == "ex", Q.c.chapter_id == chapter).order_by(Q.c.number)).scalars())


@pytest.mark.parametrize("checker", [Checker(), None], ids=["near-dup on", "NEAR_DUP_SCOPE=off"])
def test_normalisation_variants_are_stored_once(store, tmp_path, checker):
    """Each variant is committed by a slice of its own after the stored question (so the
    commit's exact check compares hashes), and once more by the slice that stored it (a
    chapter of one writer relies on UNIQUE(norm_hash)), then imported; none is stored."""
    assert len({BASE, *VARIANTS.values()}) == 6  # they differ as strings
    _sync(store, tmp_path, [("a", 20), ("b", 20)], slice_questions=10)
    first = store.claim("ex", "a", "w0", 30.0, 8, slice_no=0)
    assert isinstance(first, Claimed)
    call = store.start_call(first, 1, 1, lease_s=30.0)
    store.commit_batch(first, 30.0, call, [_q(NFC)], model="m", usage=Usage(1, 1, 0.0),
                       near_dup=checker)
    other = store.claim("ex", "a", "w1", 30.0, 8, slice_no=1)
    assert isinstance(other, Claimed)
    for name, variant in VARIANTS.items():
        for claim in (other, first):
            call = store.start_call(claim, claim.first_number + 1, 1, lease_s=30.0)
            committed = store.commit_batch(claim, 30.0, call, [_q(variant)], model="m",
                                           usage=Usage(1, 1, 0.0), near_dup=checker)
            assert committed.kept == (), (name, claim.slice_no)
    assert _texts(store) == [NFC]
    # What the pipeline drops before the commit (parse_questions' `known`): the claim's.
    assert {normalise(v) for v in VARIANTS.values()} <= other.known
    # A question that differs in a word is still new.
    call = store.start_call(other, 11, 1, lease_s=30.0)
    new = BASE.replace("AWS", "GCP")
    assert store.commit_batch(other, 30.0, call, [_q(new)], model="m", usage=Usage(1, 1, 0.0),
                              near_dup=checker).kept == (new,)

    # The same through an import (chapter b).
    assert store.import_questions("ex", {"b": [_q(NFC)]}, "one.jsonl").imported == 1
    result = store.import_questions("ex", {"b": [_q(v) for v in VARIANTS.values()]},
                                    "variants.jsonl", near_dup=checker)
    assert (result.imported, result.already_stored) == (0, len(VARIANTS))
    assert _texts(store, "b") == [NFC]


# ---------------------------------------------------------------- migration 0013
def _old_hash(t: str) -> str:
    return hashlib.md5(" ".join(t.lower().split()).encode()).hexdigest()


AWS = "Which AWS service runs code without servers?"
AWS_ZW = AWS.replace("AWS", "A\u200bWS")
CAFE = unicodedata.normalize("NFC", "Which café sells tea?")
CAFE_NFD = unicodedata.normalize("NFD", CAFE)
LAMBDA = "What is AWS Lambda's longest timeout?"
LAMBDA_FW = LAMBDA.replace("AWS", "ＡＷＳ")
PLAIN = "What port does HTTPS use by default?"
ALONE = "Which Ａzure  service stores blobs?"  # changes in form, clashes with nothing
# (chapter, text) in id order. In chapter a: AWS_ZW repeats AWS (the first kept unchanged);
# CAFE repeats CAFE_NFD; LAMBDA_FW comes first and takes LAMBDA's hash from it (the second
# unchanged in form, but it must give its hash up). Chapter b has the same text as a.
ROWS = [("a", AWS), ("a", AWS_ZW), ("a", CAFE_NFD), ("a", CAFE), ("a", LAMBDA_FW),
        ("a", LAMBDA), ("a", PLAIN), ("a", ALONE), ("b", AWS_ZW), ("c", PLAIN)]
TITLES = {"a": "Serverless\u200b computing", "b": "Storage", "c": "Networking"}


def _seed_at_0012(conn) -> None:  # type: ignore[no-untyped-def]
    from alembic import command

    from storage.db import alembic_config

    command.upgrade(alembic_config(conn), "0012")
    conn.execute(text("INSERT INTO exam (slug, title, state, auth_failures, spent_usd, "
                      "reserved_usd, created_at, updated_at, index_epoch) VALUES "
                      "('ex', 'Ex', 'active', 0, 0, 0, 1, 1, 7)"))
    for chapter, title in TITLES.items():
        conn.execute(text(
            "INSERT INTO slice (exam, chapter_id, slice_no, first_number, position, title, "
            "spec_hash, target, state, attempts, attempts_since_progress, requeues, "
            "updated_at) VALUES ('ex', :c, 0, 1, 0, :t, 'h', 20, 'pending', 0, 0, 0, 1)"),
            {"c": chapter, "t": title})
    numbers = dict.fromkeys(TITLES, 0)
    for qid, (chapter, question) in enumerate(ROWS, start=1):
        numbers[chapter] += 1
        conn.execute(text(
            "INSERT INTO question (id, exam, chapter_id, number, question, choices, "
            "answer_index, explanation, model, created_at, norm_hash) VALUES "
            "(:i, 'ex', :c, :n, :q, '[]', 0, '', 'm', 1, :h)"),
            {"i": qid, "c": chapter, "n": numbers[chapter], "q": question,
             "h": _old_hash(question)})
        # Signatures as the old code left them: here a marker, to see which are recomputed.
        conn.execute(text(
            "INSERT INTO question_sig (question_id, exam, chapter_id, tokens, key_terms, "
            "repeats, bands) VALUES (:i, 'ex', :c, 'old', 'old', 2, :b)"),
            {"i": qid, "c": chapter, "b": b"\x00" * 8})
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT setval('question_id_seq', 100)"))


def test_0013_recomputes_hashes_and_signatures_and_keeps_the_first_of_a_clash(
        db_url, tmp_path, caplog):
    from alembic import command

    from storage.db import alembic_config

    engine = connect(db_url)
    with engine.begin() as conn:
        _seed_at_0012(conn)
    with caplog.at_level(logging.WARNING), engine.begin() as conn:
        # 0013 alone: 0032 recomputes every signature again, in its chapter's language.
        command.upgrade(alembic_config(conn), "0013")
    with engine.connect() as conn:
        hashes = dict(conn.execute(text("SELECT id, norm_hash FROM question")).all())
        sigs = {r.question_id: r for r in conn.execute(select(QS))}
        epoch = conn.execute(text("SELECT index_epoch FROM exam")).scalar_one()
    # The first stored of each clash keeps the hash; the later one keeps its row, without.
    assert hashes == {1: text_hash(AWS), 2: None, 3: text_hash(CAFE), 4: None,
                      5: text_hash(LAMBDA), 6: None, 7: text_hash(PLAIN), 8: text_hash(ALONE),
                      9: text_hash(AWS), 10: text_hash(PLAIN)}
    assert hashes[1] == _old_hash(AWS) and hashes[8] != _old_hash(ALONE)
    clashes = [r.getMessage() for r in caplog.records if "normal form" in r.getMessage()]
    assert clashes == [f"ex/a: question {dup} is the same as question {kept} in the normal "
                       f"form; both are kept, and question {dup} no longer holds its hash"
                       for dup, kept in ((2, 1), (4, 3), (6, 5))]
    # Signatures recomputed where the text (or, in chapter a, the title) changes in form;
    # the others left as they were (the old code applied NFKC already).
    assert (sigs[10].tokens, sigs[10].key_terms, bytes(sigs[10].bands)) == \
        ("old", "old", b"\x00" * 8)
    for qid, (chapter, question) in enumerate(ROWS[:-1], start=1):
        sig = signature(question, TITLES[chapter])
        keys = band_keys(sig)
        assert (sigs[qid].tokens, sigs[qid].key_terms) == sig.encode(), qid
        assert bytes(sigs[qid].bands) == struct.pack(f"<{len(keys)}Q", *keys)
        assert sigs[qid].repeats == 2
    assert signature(AWS_ZW).encode() == signature(AWS).encode()
    assert epoch != 7  # every process rebuilds its in-memory band index of the exam
    migrate(engine)

    # The new code on the migrated database: every form of the clashing texts is refused.
    store = Store(engine)
    claim = store.claim("ex", "a", "w", 30.0, 8)
    assert isinstance(claim, Claimed)
    for checker in (Checker(), None):
        for variant in (AWS.replace("AWS", "ＡＷＳ"), CAFE_NFD, LAMBDA, PLAIN.upper()):
            call = store.start_call(claim, 9, 1, lease_s=30.0)
            assert store.commit_batch(claim, 30.0, call, [_q(variant)], model="m",
                                      usage=Usage(1, 1, 0.0), near_dup=checker).kept == ()
    assert _texts(store) == [t for c, t in ROWS if c == "a"]

    # Down again: the old form's hashes, which were unique, all come back.
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0012")
        back = dict(conn.execute(text("SELECT id, norm_hash FROM question")).all())
    assert back == {qid: _old_hash(t) for qid, (_, t) in enumerate(ROWS, start=1)}
    engine.dispose()


def test_0013_over_many_rows_updates_in_batches(db_url, monkeypatch):
    """More rows than a batch, half of them changed by the normal form."""
    import importlib

    migration = importlib.import_module("storage.migrations.versions.0013_normal_form")
    monkeypatch.setattr(migration, "BATCH", 7)
    engine = connect(db_url)
    texts = [f"Question {i} about {'Ａ' if i % 2 else 'A'}WS?" for i in range(40)]
    with engine.begin() as conn:
        _seed_at_0012(conn)
        conn.execute(text("DELETE FROM question_sig"))
        conn.execute(text("DELETE FROM question"))
        for i, t in enumerate(texts):
            conn.execute(text(
                "INSERT INTO question (id, exam, chapter_id, number, question, choices, "
                "answer_index, explanation, model, created_at, norm_hash) VALUES "
                "(:i, 'ex', 'b', :i, :q, '[]', 0, '', 'm', 1, :h)"),
                {"i": i + 1, "q": t, "h": _old_hash(t)})
    migrate(engine)
    with engine.connect() as conn:
        got = dict(conn.execute(text("SELECT id, norm_hash FROM question")).all())
    assert got == {i + 1: text_hash(t) for i, t in enumerate(texts)}
    engine.dispose()
