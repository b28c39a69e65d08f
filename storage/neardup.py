"""Near-duplicates in the database: the signatures and band keys of stored questions, the
check a commit makes of its batch, and the stored questions a prompt lists to steer the model
away from repeats.

The check runs inside the commit's transaction, after the slice's fence. On PostgreSQL the
commit first locks the scope's `dedup_lock` row (its chapter, or its exam), so commits that
could store near-duplicates of each other queue there: the second one's check, a statement
run after the first commit ended (READ COMMITTED), sees what the first one stored. SQLite
serialises its writers already (BEGIN IMMEDIATE), so it takes no lock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from examforge.neardup import Checker, Scope, Signature, band_keys, signature
from storage.models import DedupLock, Question, QuestionBand, QuestionSig

QS = QuestionSig.__table__  # type: ignore[attr-defined]
QB = QuestionBand.__table__  # type: ignore[attr-defined]
DL = DedupLock.__table__  # type: ignore[attr-defined]
Q = Question.__table__  # type: ignore[attr-defined]

# What a prompt lists of the chapter's stored questions, by default (AVOID_QUESTIONS).
DEFAULT_AVOID_QUESTIONS = 40


@dataclass(frozen=True)
class Signed:
    """A new question's signature and band keys, computed before the commit's transaction."""

    sig: Signature
    keys: tuple[int, ...]

    @classmethod
    def of(cls, text: str, context: str = "") -> Signed:
        sig = signature(text, context)
        return cls(sig, tuple(band_keys(sig)))


@dataclass(frozen=True)
class Verdict:
    """Which questions of a batch to keep, and the stored questions the others repeat."""

    keep: list[bool]
    repeated: list[int]  # question ids of the stored questions that were written again

    @property
    def rejected(self) -> int:
        return self.keep.count(False)


def lock(conn: Connection, exam: str, chapter_id: str, scope: Scope) -> None:
    """Take the scope's lock row until the transaction ends (PostgreSQL; a no-op on SQLite,
    whose writers are serialised already). One upsert creates the row the first time and
    locks it every time."""
    if conn.dialect.name != "postgresql":
        return
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    key = "" if scope is Scope.exam else chapter_id
    stmt = pg_insert(DL).values(exam=exam, scope=key, commits=1)
    conn.execute(stmt.on_conflict_do_update(index_elements=[DL.c.exam, DL.c.scope],
                                            set_={"commits": DL.c.commits + 1}))


def _candidates(conn: Connection, exam: str, chapter_id: str, scope: Scope,
                keys: Sequence[int]) -> tuple[dict[int, list[int]], dict[int, Signature]]:
    """The stored questions of the scope sharing a band key with `keys` (the batch's), by
    key, and their signatures. Two statements whatever the batch: the band rows (an index
    lookup per key, whose cost depends on how many stored questions are alike, not on how
    many are stored), then the signatures of the distinct candidates."""
    by_key: dict[int, list[int]] = {}
    sigs: dict[int, Signature] = {}
    wanted = sorted(set(keys))
    if not wanted:
        return by_key, sigs
    params: dict[str, Any] = {"exam": exam, "chapter": chapter_id}
    dialect = conn.dialect.name
    params["keys"] = _values(dialect, wanted)
    for key, qid in conn.execute(_statement("bands", scope, dialect), params):
        by_key.setdefault(key, []).append(qid)
    ids = sorted({qid for qids in by_key.values() for qid in qids})
    if ids:
        for qid, tokens, key_terms, text in conn.execute(_statement("sigs", scope, dialect),
                                                         {"ids": _values(dialect, ids)}):
            sigs[qid] = Signature.decode(tokens, key_terms, text)
    return by_key, sigs


_STATEMENTS: dict[tuple[str, Scope, str], Any] = {}


def _in(column: Any, name: str, dialect: str, item: Any) -> Any:
    """`column` in the list bound as `name` (see `_values`), as one parameter: an array on
    PostgreSQL (`= ANY`), a JSON array read by `json_each` on SQLite. A batch's 3,200 band
    keys expanded into as many parameters cost more to render and convert than the query
    takes to run (cProfile)."""
    if dialect == "postgresql":
        return column == any_(bindparam(name, type_=ARRAY(item)))
    return column.in_(select(literal_column("value")).select_from(
        func.json_each(bindparam(name))).scalar_subquery())


def _values(dialect: str, values: list[int]) -> Any:
    return values if dialect == "postgresql" else json.dumps(values)


def _statement(name: str, scope: Scope, dialect: str) -> Any:
    """The check's statements, built once (building one costs more than running it)."""
    stmt = _STATEMENTS.get((name, scope, dialect))
    if stmt is None:
        if name == "bands":
            stmt = select(QB.c.band_key, QB.c.question_id).where(
                QB.c.exam == bindparam("exam"), _in(QB.c.band_key, "keys", dialect, BigInteger))
            if scope is Scope.chapter:
                stmt = stmt.where(QB.c.chapter_id == bindparam("chapter"))
        else:
            stmt = (select(QS.c.question_id, QS.c.tokens, QS.c.key_terms, Q.c.question)
                    .join(Q, Q.c.id == QS.c.question_id)
                    .where(_in(QS.c.question_id, "ids", dialect, Integer)))
        _STATEMENTS[(name, scope, dialect)] = stmt
    return stmt


def check(conn: Connection, exam: str, chapter_id: str, checker: Checker,
          batch: Sequence[Signed | None]) -> Verdict:
    """Which questions of `batch` are new: not a near-duplicate of a stored question of the
    scope, nor of an earlier question of the batch. (None: already dropped, kept False.)"""
    by_key, stored = _candidates(conn, exam, chapter_id, checker.scope,
                                 [k for s in batch if s is not None for k in s.keys])
    keep: list[bool] = []
    repeated: list[int] = []
    kept: list[Signed] = []
    for new in batch:
        if new is None:
            keep.append(False)
            continue
        # Its own candidates (sharing a band key with it), verified exactly.
        mine = sorted({qid for k in new.keys for qid in by_key.get(k, ())})
        hit = next((qid for qid in mine if checker.is_near(new.sig, stored[qid])), None)
        if hit is not None:
            repeated.append(hit)
            keep.append(False)
        elif any(checker.is_near(new.sig, other.sig) for other in kept):
            keep.append(False)
        else:
            kept.append(new)
            keep.append(True)
    return Verdict(keep, repeated)


def index(conn: Connection, exam: str, chapter_id: str, ids: Sequence[int],
          signed: Sequence[Signed]) -> None:
    """Store the signatures and band keys of questions just inserted."""
    if not ids:
        return
    conn.execute(insert(QS), [
        {"question_id": qid, "exam": exam, "chapter_id": chapter_id,
         "tokens": s.sig.encode()[0], "key_terms": s.sig.encode()[1], "repeats": 0}
        for qid, s in zip(ids, signed)])
    bands = [(exam, k, qid, chapter_id) for qid, s in zip(ids, signed) for k in set(s.keys)]
    if bands:
        # 64 rows a question: straight to the driver's executemany, which takes a tenth of
        # the time SQLAlchemy's row-by-row parameter processing does.
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        conn.exec_driver_sql(
            "INSERT INTO question_band (exam, band_key, question_id, chapter_id) "
            f"VALUES ({mark}, {mark}, {mark}, {mark})", bands)


def index_rows(conn: Connection, rows: Sequence[tuple[int, str, str, str, str]]) -> None:
    """Index stored questions given as (id, exam, chapter_id, text, chapter title): the
    migration's backfill and `producer import`."""
    by_chapter: dict[tuple[str, str], tuple[list[int], list[Signed]]] = {}
    for qid, exam, chapter_id, text, title in rows:
        ids, signed = by_chapter.setdefault((exam, chapter_id), ([], []))
        ids.append(qid)
        signed.append(Signed.of(text, title))
    for (exam, chapter_id), (ids, signed) in by_chapter.items():
        index(conn, exam, chapter_id, ids, signed)


def record_repeats(conn: Connection, question_ids: Sequence[int]) -> None:
    """Count, on the stored questions, each time the model wrote one of them again."""
    for qid in question_ids:
        conn.execute(update(QS).where(QS.c.question_id == qid)
                     .values(repeats=QS.c.repeats + 1))


def forget(conn: Connection, exam: str, chapter_ids: Sequence[str] | None = None) -> None:
    """Drop the index rows of an exam's questions (all of them, or those of some chapters),
    with the questions themselves."""
    for table in (QS, QB):
        where = [table.c.exam == exam]
        if chapter_ids is not None:
            where.append(table.c.chapter_id.in_(list(chapter_ids)))
        conn.execute(delete(table).where(*where))
    if chapter_ids is None:
        conn.execute(delete(DL).where(DL.c.exam == exam))


def _steer_statement(name: str, dialect: str = "") -> Any:
    """steering's statements, built once with bind parameters."""
    stmt = _STATEMENTS.get((name, Scope.chapter, dialect))
    if stmt is None:
        chapter = (Q.c.exam == bindparam("exam"), Q.c.chapter_id == bindparam("chapter"))
        if name == "repeated":
            stmt = (select(Q.c.id, Q.c.question).join(QS, QS.c.question_id == Q.c.id)
                    .where(QS.c.exam == bindparam("exam"),
                           QS.c.chapter_id == bindparam("chapter"), QS.c.repeats > 0)
                    .order_by(QS.c.repeats.desc(), Q.c.id).limit(bindparam("n")))
        elif name == "newest":
            stmt = (select(Q.c.id, Q.c.question).where(*chapter).order_by(Q.c.id.desc())
                    .limit(bindparam("n")))
        else:
            stmt = (select(Q.c.id, Q.c.question)
                    .where(*chapter, _in(Q.c.number, "numbers", dialect, Integer))
                    .limit(bindparam("n")))
        _STATEMENTS[(name, Scope.chapter, dialect)] = stmt
    return stmt


def steering(conn: Connection, exam: str, chapter_id: str, limit: int,
             numbers: tuple[int, int], seed: int) -> tuple[str, ...]:
    """The stored questions a prompt lists as "do not repeat", at most `limit`, covering the
    whole chapter however long it grows, least important first (a caller that must cut
    keeps the tail):

    - a rotating sample of the chapter's numbers (`numbers`: first and last), drawn anew for
      each call (`seed`), so that over a few calls every stored question is shown;
    - the newest questions (what the model just wrote, in any slice);
    - the questions the model has written again most often (rejected near-duplicates):
      the ones it keeps coming back to, which a list of the newest never shows.
    """
    if limit <= 0:
        return ()
    key = {"exam": exam, "chapter": chapter_id}
    repeated = list(conn.execute(_steer_statement("repeated"), {**key, "n": limit // 2}))
    newest = list(conn.execute(_steer_statement("newest"), {**key, "n": max(1, limit // 4)}))
    first, last = numbers
    room = limit - len(repeated) - len(newest)
    sample: list[tuple[int, str]] = []
    if room > 0 and last >= first and len(newest) >= max(1, limit // 4):
        # (A chapter with fewer than that stored has them all in `newest` already.)
        rng = random.Random(seed)
        drawn = rng.sample(range(first, last + 1), min(last - first + 1, room * 2))
        sample = list(conn.execute(_steer_statement("sample", conn.dialect.name),
                                   {**key, "n": room,
                                    "numbers": _values(conn.dialect.name, drawn)}))
    seen: set[int] = set()
    out: list[str] = []
    # Most important last; a question in several parts stays in its most important place.
    for qid, text in reversed([*sample, *reversed(newest), *reversed(repeated)]):
        if qid not in seen:
            seen.add(qid)
            out.append(text)
    return tuple(reversed(out[:limit]))
