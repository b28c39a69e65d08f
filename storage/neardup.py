"""Near-duplicates in the database: the signatures and band keys of stored questions, the
check a commit makes of its batch, and the stored questions a prompt lists to steer the model
away from repeats.

The check runs inside the commit's transaction, after the slice's fence. On PostgreSQL the
commit first locks the scope's `dedup_lock` row (its chapter, or its exam), so commits that
could store near-duplicates of each other queue there: the second one's check, a statement
run after the first commit ended (READ COMMITTED), sees what the first one stored. SQLite
serialises its writers already (BEGIN IMMEDIATE), so it takes no lock.

Where the band index lives. The database keeps each stored question's signature and its 64
band keys (`question_sig.bands`, one row per question, written in id order). The index from
band key to question, which finds a new question's candidates, is kept in memory by each
process, one per scope (`_BandIndex`), and brought up to date inside the commit's
transaction by reading the rows stored since it last looked (`question_id` above the highest
it has: within a scope, commits are serialised by the lock above, by the slice's fence, or
by an import's slice locks, so ids grow in commit order there). The first version kept the
index in a table, 64 rows a question: each commit wrote 320 rows at random places of a
b-tree, and the commit's check cost three times the rest of the commit (bench overhead run
F: 23 ms against 10 per chapter). Candidates are verified against the signatures the index
read with their keys (see `_candidates` for why they cannot be stale); `exam.index_epoch`,
changed whenever questions are deleted, makes a process rebuild its index, also because
SQLite may give a deleted question's id to a new one.
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
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

from examforge.languages import DEFAULT_LANGUAGE
from examforge.neardup import Checker, Scope, Signature, sign_many
from storage.base import execute_hot
from storage.models import DedupLock, Exam, Question, QuestionSig, new_epoch
from storage.types import Steer

QS = QuestionSig.__table__  # type: ignore[attr-defined]
E = Exam.__table__  # type: ignore[attr-defined]
DL = DedupLock.__table__  # type: ignore[attr-defined]
Q = Question.__table__  # type: ignore[attr-defined]



@dataclass(frozen=True)
class Signed:
    """A new question's signature and band keys, computed before the commit's transaction."""

    sig: Signature
    keys: tuple[int, ...]

    @classmethod
    def of(cls, text: str, context: str = "", language: str = DEFAULT_LANGUAGE) -> Signed:
        return cls.many([text], context, language)[0]

    @classmethod
    def many(cls, texts: Sequence[str], context: str = "",
             language: str = DEFAULT_LANGUAGE) -> list[Signed]:
        """`of` for every question of a reply, the band keys in one vectorised pass."""
        return [cls(sig, tuple(keys))
                for sig, keys in sign_many((t, context, language) for t in texts)]

    @classmethod
    def groups(cls, batches: Sequence[tuple[Sequence[str], str, str]]) -> list[list[Signed]]:
        """`many` for several replies at once, each (texts, context, language): the replies of
        several calls committed together (group commit) signed in one vectorised pass
        (examforge.neardup.sign_many), whatever their chapters and languages."""
        flat = [cls(sig, tuple(keys)) for sig, keys in sign_many(
            (t, context, language) for texts, context, language in batches for t in texts)]
        out, start = [], 0
        for texts, _, _ in batches:
            out.append(flat[start:start + len(texts)])
            start += len(texts)
        return out

    def blob(self) -> bytes:
        """The band keys as stored (`question_sig.bands`): unsigned 64-bit, little-endian."""
        return struct.pack(f"<{len(self.keys)}Q", *self.keys)


@dataclass(frozen=True)
class Verdict:
    """Which questions of a batch to keep, and the stored questions the others repeat."""

    keep: list[bool]
    repeated: list[int]  # question ids of the stored questions that were written again
    # The scope's index as the check saw it: its epoch and the highest question id it held
    # (`add_own`, after the commit, adds the batch's questions if it is still there).
    epoch: int | None = None
    max_id: int = 0
    # `check_local`'s: the index it was made against. The same epoch and highest id are not
    # enough: an index cleared after a group's rollback and rebuilt may hold, under an id
    # SQLite gave again, another question than the one the verdict saw.
    index: object = None

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


class _BandIndex:
    """One scope's band keys in memory: band key -> question ids, as two sorted numpy arrays
    (12 bytes a key: 64 keys a question, about 0.8 kB) plus the keys added since they were
    last merged; and the questions' signatures (about 1 kB a question). Written by hand:
    datasketch's MinHashLSH keeps Python sets per key (ten times the memory), cannot say
    which rows it has seen, and its storage backends (Redis, Cassandra) live outside our
    transaction.

    The keys added since the last merge are a dict of key -> the last id added with it, and
    the earlier ids of a key added more than once (rare: two questions share a band) in
    `shared`. So adding a question's 64 keys is one `dict.update` and its lookups one
    intersection with the dict's keys, loops in C: per key in Python they were about a
    seventh of a worker's CPU at 128 slots, where each process indexes every question of
    the scope as it reads it back."""

    def __init__(self, epoch: int | None) -> None:
        import numpy as np

        self.np = np
        self.epoch = epoch
        self.max_id = 0
        self.keys = np.empty(0, dtype=np.uint64)
        self.ids = np.empty(0, dtype=np.int32)  # question.id is a 32-bit INTEGER
        self.recent: dict[int, int] = {}
        self.shared: dict[int, list[int]] = {}  # a recent key's earlier ids
        self.recent_n = 0
        self.counted = 0  # its size as _Indexes last counted it
        # The indexed questions' signatures (read with their keys), for verifying candidates
        # without reading and decoding them again at each commit.
        self.sigs: dict[int, Signature] = {}
        self.lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self.keys) + self.recent_n

    def _add_keys(self, qid: int, keys: Sequence[int]) -> None:
        recent = self.recent
        for key in recent.keys() & keys:  # usually none
            if recent[key] != qid:
                self.shared.setdefault(key, []).append(recent[key])
        recent.update(dict.fromkeys(keys, qid))
        self.recent_n += len(keys)

    def add(self, rows: Iterable[Sequence[Any]]) -> None:
        """Index rows of (question id, band keys blob[, tokens, key terms, text]): with the
        last three, the question's signature is kept for verifying candidates."""
        for row in rows:
            qid, blob = row[0], row[1]
            self.max_id = max(self.max_id, qid)
            if len(row) > 2:
                self.sigs[qid] = Signature.decode(row[2], row[3], row[4])
            if blob:
                self._add_keys(qid, struct.unpack(f"<{len(blob) // 8}Q", blob))
        # Merged often: a dict costs about 150 bytes a key against the arrays' 12 (a worker
        # at 128 threads on 50-question chapters held 120 MB more with merges at 4,096 keys),
        # and merging sorts the arrays again, so its threshold grows with them.
        if self.recent_n > max(256, len(self.keys) // 8):
            self._merge()

    def add_signed(self, rows: Iterable[tuple[int, Signed]]) -> None:
        """`add` for questions this process signed itself: their keys and signatures as
        computed, not packed and decoded again."""
        for qid, s in rows:
            self.max_id = max(self.max_id, qid)
            self.sigs[qid] = s.sig
            self._add_keys(qid, s.keys)
        if self.recent_n > max(256, len(self.keys) // 8):
            self._merge()

    def _merge(self) -> None:
        np = self.np
        recent, shared = self.recent, self.shared
        n = len(recent)
        keys = [self.keys, np.fromiter(recent, dtype=np.uint64, count=n)]
        ids = [self.ids, np.fromiter(recent.values(), dtype=np.int32, count=n)]
        for key, earlier in shared.items():
            keys.append(np.full(len(earlier), key, dtype=np.uint64))
            ids.append(np.asarray(earlier, dtype=np.int32))
        # A stable sort (timsort) of the sorted arrays and the new keys: one run and a short
        # tail, so close to linear. (np.insert at searched places measured no faster.)
        keys_, ids_ = np.concatenate(keys), np.concatenate(ids)
        order = np.argsort(keys_, kind="stable")
        self.keys, self.ids = keys_[order], ids_[order]
        self.recent, self.shared, self.recent_n = {}, {}, 0

    def lookup(self, keys: Sequence[int]) -> set[int]:
        """The ids of the questions sharing a band key with `keys`."""
        recent = self.recent
        hits = recent.keys() & keys
        out = {recent[key] for key in hits}
        if self.shared:
            for key in hits:
                out.update(self.shared.get(key, ()))
        if len(self.keys):
            # One binary search a key, and a second only for the keys found (few: a new
            # question shares a band with a stored one rarely); the searches miss the cache,
            # not the Python around them, on an index of a large exam.
            np = self.np
            wanted = np.fromiter(keys, dtype=np.uint64, count=len(keys))
            lo = np.searchsorted(self.keys, wanted, "left")
            found = self.keys[np.minimum(lo, len(self.keys) - 1)] == wanted
            if found.any():
                hi = np.searchsorted(self.keys, wanted[found], "right")
                for a, b in zip(lo[found].tolist(), hi.tolist()):
                    out.update(self.ids[a:b].tolist())
        return out


class _Indexes:
    """Every scope's band index of this process, least recently used first, at most
    CACHE_KEYS keys in all (about 31,000 questions, 60 MB with their signatures): a scope
    dropped is rebuilt from its rows (one read of its `question_sig` rows) when it is next
    checked."""

    CACHE_KEYS = 2_000_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_scope: OrderedDict[tuple[str, str, str], _BandIndex] = OrderedDict()
        self._keys = 0  # the sizes of the indexes in _by_scope, as last counted

    def get(self, where: tuple[str, str, str], epoch: int | None) -> _BandIndex:
        if epoch is None:  # an exam row written without one (by hand): nothing to trust
            return _BandIndex(None)
        with self._lock:
            idx = self._by_scope.get(where)
            if idx is None or idx.epoch != epoch:
                if idx is not None:
                    self._keys -= idx.counted
                idx = self._by_scope[where] = _BandIndex(epoch)
            self._by_scope.move_to_end(where)
            return idx

    def peek(self, where: tuple[str, str, str], epoch: int | None) -> _BandIndex | None:
        """The scope's index at `epoch`, made when there is none; None when it is at
        another epoch (left as it is)."""
        if epoch is None:
            return None
        with self._lock:
            idx = self._by_scope.get(where)
            if idx is None:
                idx = self._by_scope[where] = _BandIndex(epoch)
            elif idx.epoch != epoch:
                return None
            self._by_scope.move_to_end(where)
            return idx

    def grew(self, where: tuple[str, str, str], idx: _BandIndex) -> None:
        """Count what `idx` added since it was last counted, and drop the least recently
        used indexes past CACHE_KEYS."""
        with self._lock:
            if self._by_scope.get(where) is not idx:
                return  # dropped or replaced meanwhile
            self._keys += idx.size - idx.counted
            idx.counted = idx.size
            while self._keys > self.CACHE_KEYS and len(self._by_scope) > 1:
                _, dropped = self._by_scope.popitem(last=False)
                self._keys -= dropped.counted

    def clear(self) -> None:
        with self._lock:
            self._by_scope.clear()
            self._keys = 0


INDEXES = _Indexes()


# `check`'s epoch when its caller has not read it.
UNREAD: Any = object()


def _candidates(conn: Connection, exam: str, chapter_id: str, scope: Scope,
                batch: Sequence[Signed | None], epoch: Any = UNREAD
                ) -> tuple[list[set[int]], dict[int, Signature], int | None, int]:
    """Each new question's candidates (the stored questions of the scope sharing a band key
    with it), the signatures of the scope's questions, the exam's index epoch and the
    highest question id the index has read. Two statements whatever the batch
    and the chapter: the exam's index epoch, and the scope's rows stored since the index
    last looked (none, mostly: this process stored them, or another one a few).

    The signatures are the index's own, read with the keys. They cannot be stale for the
    chapter being committed: its questions are deleted only with its slices, whose rows the
    commit's fence holds (a regeneration waits for the commit, or the fence fails). Deleting
    any question changes the exam's epoch, which rebuilds the index at the next check.
    `epoch`: the exam's, when the caller read it in this transaction already."""
    if epoch is UNREAD:
        epoch = _epoch(conn, exam, scope)
    where = where_of(str(conn.engine.url), exam, chapter_id, scope)
    idx = INDEXES.get(where, epoch)
    with idx.lock:
        _catch_up(conn, idx, exam, chapter_id, scope)
        mine = [idx.lookup(s.keys) if s is not None else set() for s in batch]
        grown = idx.size != idx.counted
        sigs, max_id = idx.sigs, idx.max_id
    if grown:
        INDEXES.grew(where, idx)
    return mine, sigs, epoch, max_id


def _epoch(conn: Connection, exam: str, scope: Scope) -> int | None:
    """The exam's index epoch, as this transaction reads it."""
    return execute_hot(conn, _statement("epoch", scope, ""),  # type: ignore[no-any-return]
                       {"exam": exam}).scalar_one_or_none()


def _catch_up(conn: Connection, idx: _BandIndex, exam: str, chapter_id: str,
              scope: Scope) -> None:
    """Index the scope's rows stored since `idx` last looked (the caller holds its lock)."""
    idx.add(execute_hot(conn, _statement("since", scope, ""),
                        {"exam": exam, "chapter": chapter_id, "after": idx.max_id}))


_STATEMENTS: dict[tuple[str, Scope, str], Any] = {}


def _in(column: Any, name: str, dialect: str, item: Any) -> Any:
    """`column` in the list bound as `name` (see `_values`), as one parameter: an array on
    PostgreSQL (`= ANY`), a JSON array read by `json_each` on SQLite. A long list expanded
    into as many parameters costs more to render and convert than the query takes to run
    (cProfile)."""
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
        in_scope = [QS.c.exam == bindparam("exam")]
        if scope is Scope.chapter:
            in_scope.append(QS.c.chapter_id == bindparam("chapter"))
        if name == "epoch":
            stmt = select(E.c.index_epoch).where(E.c.slug == bindparam("exam"))
        else:  # since
            stmt = (select(QS.c.question_id, QS.c.bands, QS.c.tokens, QS.c.key_terms,
                           Q.c.question)
                    .join(Q, Q.c.id == QS.c.question_id)
                    .where(*in_scope, QS.c.question_id > bindparam("after"))
                    .order_by(QS.c.question_id))
        _STATEMENTS[(name, scope, dialect)] = stmt
    return stmt


def near_of(conn: Connection, exam: str, chapter_id: str, checker: Checker, new: Signed,
            exclude_id: int) -> list[int]:
    """The stored questions of the scope `new` is a near-duplicate of, but `exclude_id`
    (an edited question is compared with every question but itself), lowest id first."""
    candidates, stored, _, _ = _candidates(conn, exam, chapter_id, checker.scope, [new])
    return [qid for qid in sorted(candidates[0])
            if qid != exclude_id and qid in stored and checker.is_near(new.sig, stored[qid])]


def check(conn: Connection, exam: str, chapter_id: str, checker: Checker,
          batch: Sequence[Signed | None], epoch: Any = UNREAD,
          local: tuple[Verdict, int] | None = None) -> Verdict:
    """Which questions of `batch` are new: not a near-duplicate of a stored question of the
    scope, nor of an earlier question of the batch. (None: already dropped, kept False.)
    `epoch`: the exam's index epoch, when the caller read it in this transaction already.
    `local`: `check_local`'s answer for this batch, made before the transaction; it is the
    verdict when the index, brought up to date here, is still where that check saw it."""
    if local is not None:
        verdict, seen = local
        if epoch is UNREAD:
            epoch = _epoch(conn, exam, checker.scope)
        idx = INDEXES.get(where_of(str(conn.engine.url), exam, chapter_id, checker.scope),
                          epoch)
        if epoch is not None and epoch == verdict.epoch:
            with idx.lock:
                _catch_up(conn, idx, exam, chapter_id, checker.scope)
                if idx.max_id == seen and idx is verdict.index:
                    return dataclasses.replace(verdict, index=None)
    candidates, stored, epoch, max_id = _candidates(conn, exam, chapter_id, checker.scope,
                                                    batch, epoch)
    return dataclasses.replace(_verdict(checker, batch, candidates, stored), epoch=epoch,
                               max_id=max_id)


def where_of(url: str, exam: str, chapter_id: str, scope: Scope) -> tuple[str, str, str]:
    """The key of a scope's in-memory index (INDEXES)."""
    return (url, exam, "" if scope is Scope.exam else chapter_id)


def check_local(url: str, exam: str, chapter_id: str, checker: Checker, epoch: int | None,
                batch: Sequence[Signed | None]) -> tuple[Verdict, int] | None:
    """`check` against this process's index of the scope as it stands, reading nothing: the
    verdict and the highest question id the index has (what the one-round-trip commit,
    storage.fastpath, verifies is still the scope's highest, under the scope's lock). None
    when the index cannot be trusted without a read (no epoch known)."""
    if epoch is None:
        return None
    where = where_of(url, exam, chapter_id, checker.scope)
    idx = INDEXES.peek(where, epoch)
    if idx is None:  # another epoch's: a claim older than an edit must not replace it
        return None
    with idx.lock:
        candidates = [idx.lookup(s.keys) if s is not None else set() for s in batch]
        max_id, sigs = idx.max_id, idx.sigs
    # The candidates verified outside the lock, which a transaction checking the scope may
    # be waiting for: the signatures of ids up to `max_id` do not change under an epoch.
    verdict = _verdict(checker, batch, candidates, sigs)
    return dataclasses.replace(verdict, epoch=epoch, max_id=max_id, index=idx), max_id


def add_own(url: str, exam: str, chapter_id: str, scope: Scope, epoch: int | None,
            seen_max_id: int, ids: Sequence[int], signed: Sequence[Signed],
            texts: Sequence[str]) -> None:
    """After a one-round-trip commit: index the questions it stored, if the scope's index is
    still where the commit's check saw it (`seen_max_id`: the commit verified nothing else was
    stored in the scope above it). Otherwise leave it: the next commit finds rows above the
    index's highest id and checks through the general path, which reads them."""
    if epoch is None or not ids:
        return
    where = where_of(url, exam, chapter_id, scope)
    idx = INDEXES.get(where, epoch)
    with idx.lock:
        if idx.max_id != seen_max_id:
            return
        idx.add_signed(zip(ids, signed))
        grown = idx.size != idx.counted
    if grown:
        INDEXES.grew(where, idx)


def _verdict(checker: Checker, batch: Sequence[Signed | None], candidates: list[set[int]],
             stored: dict[int, Signature]) -> Verdict:
    keep: list[bool] = []
    repeated: list[int] = []
    kept: list[Signed] = []
    # A model's batch is compared pairwise; an imported file of thousands through band keys
    # of its own, as the stored questions are.
    local = _BandIndex(None) if len(batch) > 64 else None
    for new, mine in zip(batch, candidates):
        if new is None:
            keep.append(False)
            continue
        # Its own candidates (sharing a band key with it), verified exactly.
        hit = next((qid for qid in sorted(mine)
                    if qid in stored and checker.is_near(new.sig, stored[qid])), None)
        earlier = kept if local is None else [kept[i] for i in sorted(local.lookup(new.keys))]
        if hit is not None:
            repeated.append(hit)
            keep.append(False)
        elif any(checker.is_near(new.sig, other.sig) for other in earlier):
            keep.append(False)
        else:
            if local is not None:
                local.add([(len(kept), new.blob())])
            kept.append(new)
            keep.append(True)
    return Verdict(keep, repeated)


def index(conn: Connection, exam: str, chapter_id: str, ids: Sequence[int],
          signed: Sequence[Signed]) -> None:
    """Store the signatures and band keys of questions just inserted. (The processes'
    in-memory indexes read them at their next check of the scope, once committed.)"""
    if not ids:
        return
    rows = []
    for qid, s in zip(ids, signed):
        tokens, key_terms = s.sig.encode()
        rows.append({"question_id": qid, "exam": exam, "chapter_id": chapter_id,
                     "tokens": tokens, "key_terms": key_terms, "repeats": 0,
                     "bands": s.blob()})
    execute_hot(conn, _INSERT_SIG, rows)


_INSERT_SIG = insert(QS)


def record_repeats(conn: Connection, question_ids: Sequence[int]) -> None:
    """Count, on the stored questions, each time the model wrote one of them again."""
    for qid in question_ids:
        conn.execute(update(QS).where(QS.c.question_id == qid)
                     .values(repeats=QS.c.repeats + 1))


def forget(conn: Connection, exam: str, chapter_ids: Sequence[str] | None = None) -> None:
    """Drop the index rows of an exam's questions (all of them, or those of some chapters),
    with the questions themselves; the exam's new index epoch makes every process rebuild
    its in-memory index of the exam."""
    where = [QS.c.exam == exam]
    if chapter_ids is not None:
        where.append(QS.c.chapter_id.in_(list(chapter_ids)))
    conn.execute(delete(QS).where(*where))
    conn.execute(update(E).where(E.c.slug == exam).values(index_epoch=new_epoch()))
    if chapter_ids is None:
        conn.execute(delete(DL).where(DL.c.exam == exam))


def forget_questions(conn: Connection, exam: str, question_ids: Sequence[int]) -> None:
    """Drop the index rows of some of an exam's questions (deleted, or their text changed by
    an edit); the exam's new index epoch makes every process rebuild its in-memory index."""
    if not question_ids:
        return
    ids = list(question_ids)
    for i in range(0, len(ids), 500):
        conn.execute(delete(QS).where(QS.c.exam == exam, QS.c.question_id.in_(ids[i:i + 500])))
    conn.execute(update(E).where(E.c.slug == exam).values(index_epoch=new_epoch()))


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
            stmt = (select(Q.c.id, Q.c.question, Q.c.number)
                    .where(*chapter, _in(Q.c.number, "numbers", dialect, Integer)))
        _STATEMENTS[(name, Scope.chapter, dialect)] = stmt
    return stmt


class Steering(tuple):  # type: ignore[type-arg]
    """What the next prompts list, as the flat tuple of texts a prompt shows (sample, newest,
    repeated: least important first), and its three parts, so that a caller adding the
    questions it has just received (runner.pipeline) replaces the newest with them and
    keeps the sample that makes the list cover the whole chapter."""

    sample: tuple[str, ...]
    newest: tuple[str, ...]
    repeated: tuple[str, ...]

    def __new__(cls, sample: Sequence[str] = (), newest: Sequence[str] = (),
                repeated: Sequence[str] = ()) -> "Steering":
        # A question in several parts stays in its most important one.
        later = set(repeated)
        newest = tuple(t for t in newest if t not in later)
        later.update(newest)
        sample = tuple(t for t in sample if t not in later)
        self = super().__new__(cls, (*sample, *newest, *repeated))
        self.sample, self.newest, self.repeated = sample, newest, tuple(repeated)
        return self

    def with_fresh(self, fresh: Sequence[str], limit: int) -> list[str]:
        """The list for a prompt built before the questions just received (`fresh`, oldest
        first) are committed, at most `limit`: the repeated ones (at most half), a quarter
        kept for the sample whenever there is one, and the newest questions (`fresh` first)
        in the rest, then more of the sample if room is left."""
        if limit <= 0:
            return []
        repeated = list(self.repeated[-(limit // 2):]) if limit // 2 else []
        taken = set(repeated)
        newest = [t for t in dict.fromkeys([*self.newest, *fresh]) if t not in taken]
        sample = [t for t in self.sample if t not in taken and t not in newest]
        keep_sample = min(len(sample), max(limit // 4, limit - len(repeated) - len(newest)))
        room = limit - len(repeated) - keep_sample
        newest = newest[-room:] if room > 0 else []
        return [*sample[:keep_sample], *newest, *repeated]


def steering(conn: Connection, exam: str, chapter_id: str, limit: int,
             numbers: tuple[int, int], seed: int) -> Steering:
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
        return Steering()
    key = {"exam": exam, "chapter": chapter_id}
    repeated = list(execute_hot(conn, _steer_statement("repeated"), {**key, "n": limit // 2}))
    newest = list(execute_hot(conn, _steer_statement("newest"),
                              {**key, "n": max(1, limit // 4)}))
    first, last = numbers
    room = limit - len(repeated) - len(newest)
    sample: list[tuple[int, str]] = []
    if room > 0 and last >= first and len(newest) >= max(1, limit // 4):
        # (A chapter with fewer than that stored has them all in `newest` already.)
        drawn = sample_numbers(numbers, limit, seed)[:room * 2]
        rows = execute_hot(conn, _steer_statement("sample", conn.dialect.name),
                           {**key, "numbers": _values(conn.dialect.name, drawn)}).all()
        # In the order drawn, not the database's (its index order would favour the chapter's
        # first numbers), leaving out what the other parts list.
        listed = {qid for qid, _ in (*newest, *repeated)}
        place = {n: i for i, n in enumerate(drawn)}
        sample = [(qid, text) for qid, text, _ in sorted(rows, key=lambda r: place[r[2]])
                  if qid not in listed][:room]
    # Most important last in each part (the statements read newest and most repeated first).
    return Steering([t for _, t in sample], [t for _, t in reversed(newest)],
                    [t for _, t in reversed(repeated)])


def sample_numbers(numbers: tuple[int, int], limit: int, seed: int) -> list[int]:
    """The rotating sample's numbers drawn for one call (`steering`), in the order drawn: as
    many as the most the sample can use (twice `limit`); `steering` takes the first twice its
    room. Drawn before the room is known, so that the one-round-trip commit (storage.fastpath)
    reads them in the same statement: a prefix of a random sample is a random sample."""
    first, last = numbers
    if last < first or limit <= 0:
        return []
    return random.Random(seed).sample(range(first, last + 1), min(last - first + 1, limit * 2))


def steering_of(limit: int, numbers: tuple[int, int], seed: int,
                repeated: list[tuple[int, str]], newest: list[tuple[int, str]],
                sampled: list[tuple[int, str, int]]) -> Steering:
    """`steering` from rows already read (newest and most repeated first, as its statements
    read them; `sampled`: the rows of `sample_numbers`' numbers that exist)."""
    room = limit - len(repeated) - len(newest)
    sample: list[tuple[int, str]] = []
    if room > 0 and numbers[1] >= numbers[0] and len(newest) >= max(1, limit // 4):
        drawn = sample_numbers(numbers, limit, seed)[:room * 2]
        place = {n: i for i, n in enumerate(drawn)}
        listed = {qid for qid, _ in (*newest, *repeated)}
        sample = [(qid, text) for qid, text, n in sorted(
            (r for r in sampled if r[2] in place), key=lambda r: place[r[2]])
            if qid not in listed][:room]
    return Steering([t for _, t in sample], [t for _, t in reversed(newest)],
                    [t for _, t in reversed(repeated)])


def steered(conn: Connection, steer: Steer, exam: str, chapter_id: str, chapter_target: int,
            seed: int) -> tuple[str, ...]:
    """The stored questions of the chapter the next prompt lists, as `steer` asks: chosen
    over the whole chapter (`steering`) or the newest only (mode `recent`)."""
    if steer.mode == "recent":
        return tuple(reversed(conn.execute(
            select(Q.c.question).where(Q.c.exam == exam, Q.c.chapter_id == chapter_id)
            .order_by(Q.c.id.desc()).limit(steer.avoid)).scalars().all()))
    return steering(conn, exam, chapter_id, steer.avoid, (1, chapter_target), seed)
