"""Course material in the database: a chapter's passages, the sources uploaded through the
API, and how much of a chapter's material its questions cite (examforge.sources)."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Connection

from examforge.errors import SourceError
from examforge.sources import MAX_UPLOADS_PER_EXAM, Passage
from storage.base import Q, StoreBase
from storage.models import PassageRow, SourceFile, SourceText

P = PassageRow.__table__  # type: ignore[attr-defined]
F = SourceFile.__table__  # type: ignore[attr-defined]
T = SourceText.__table__  # type: ignore[attr-defined]


def write_passages(conn: Connection, slug: str, chapter_id: str,
                   passages: Sequence[Passage]) -> None:
    """Replace the chapter's passages (in the caller's transaction: enqueue's)."""
    conn.execute(delete(P).where(P.c.exam == slug, P.c.chapter_id == chapter_id))
    if passages:
        conn.execute(P.insert(), [{"exam": slug, "chapter_id": chapter_id, "seq": p.seq,
                                   "source": p.source, "location": p.where, "text": p.text}
                                  for p in passages])


def read_passages(conn: Connection, slug: str, chapter_id: str) -> tuple[Passage, ...]:
    """The chapter's passages, in order (none for a chapter without sources)."""
    rows = conn.execute(select(P.c.seq, P.c.source, P.c.location, P.c.text)
                        .where(P.c.exam == slug, P.c.chapter_id == chapter_id)
                        .order_by(P.c.seq)).all()
    return tuple(Passage(r.seq, r.source, r.location, r.text) for r in rows)


def forget_passages(conn: Connection, slug: str, chapter_ids: Sequence[str] | None = None
                    ) -> None:
    where = [P.c.exam == slug]
    if chapter_ids is not None:
        where.append(P.c.chapter_id.in_(list(chapter_ids)))
    conn.execute(delete(P).where(*where))


def coverage(conn: Connection, slug: str) -> dict[str, tuple[int, int]]:
    """`Grounding.passage_coverage` in the caller's transaction (status reads it in its own)."""
    totals: dict[str, int] = {r[0]: r[1] for r in conn.execute(
        select(P.c.chapter_id, func.count()).where(P.c.exam == slug)
        .group_by(P.c.chapter_id))}
    if not totals:
        return {}
    cited: dict[str, int] = {r[0]: r[1] for r in conn.execute(
        select(Q.c.chapter_id, func.count(func.distinct(Q.c.passage)))
        .where(Q.c.exam == slug, Q.c.passage.is_not(None))
        .group_by(Q.c.chapter_id))}
    return {cid: (int(cited.get(cid, 0)), int(n)) for cid, n in totals.items()}


class Grounding(StoreBase):
    """Passages, uploaded sources and the share of the material cited."""

    def chapter_passages(self, slug: str, chapter_id: str) -> list[Passage]:
        """The chapter's passages, in order (none for a chapter without sources)."""
        with self._read() as conn:
            return list(read_passages(conn, slug, chapter_id))

    def passage(self, slug: str, chapter_id: str, seq: int) -> Passage | None:
        """One passage of a chapter: what a question citing it (`question.passage`) was
        written from, e.g. for a check of its answer key against the material."""
        with self._read() as conn:
            r = conn.execute(select(P.c.seq, P.c.source, P.c.location, P.c.text).where(
                P.c.exam == slug, P.c.chapter_id == chapter_id, P.c.seq == seq)).first()
        return None if r is None else Passage(r.seq, r.source, r.location, r.text)

    def passage_coverage(self, slug: str) -> dict[str, tuple[int, int]]:
        """{chapter id: (passages its stored questions cite, passages)} for the chapters of
        the exam that have passages; what `status` shows as the material covered."""
        with self._read() as conn:
            return coverage(conn, slug)

    # --- sources' text, extracted once per content ---------------------------------------

    def source_text(self, key: str) -> list[tuple[str | None, str]] | None:
        """The sections extracted before from the source `key` names (its bytes' hash and
        how it is read), or None."""
        import json

        with self._read() as conn:
            raw = conn.execute(select(T.c.sections).where(T.c.key == key)).scalar()
        return None if raw is None else [(where, text) for where, text in json.loads(raw)]

    def keep_source_text(self, key: str, sections: Sequence[tuple[str | None, str]]) -> None:
        """Keep what was extracted (a second writer of the same key changes nothing)."""
        import json

        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            conn.execute(self._insert(T).values(
                key=key, sections=json.dumps([list(s) for s in sections]),
                chars=sum(len(text) for _, text in sections), created_at=now
            ).on_conflict_do_nothing())

    # --- sources uploaded through the API --------------------------------------------------

    def put_source(self, slug: str, name: str, data: bytes) -> bool:
        """Store (or replace) an uploaded source of the exam; True if it is new. Refused
        (SourceError) past MAX_UPLOADS_PER_EXAM files."""
        digest = hashlib.sha256(data).hexdigest()
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            exists = conn.execute(select(F.c.name).where(F.c.exam == slug, F.c.name == name)
                                  ).first() is not None
            if exists:
                conn.execute(update(F).where(F.c.exam == slug, F.c.name == name).values(
                    data=data, sha256=digest, size=len(data), updated_at=now))
                return False
            count = conn.execute(select(func.count()).select_from(F)
                                 .where(F.c.exam == slug)).scalar_one()
            if count >= MAX_UPLOADS_PER_EXAM:
                raise SourceError(f"source {name} of exam {slug}: the exam already has "
                                  f"{count} sources, the most allowed")
            conn.execute(self._insert(F).values(
                exam=slug, name=name, data=data, sha256=digest, size=len(data),
                created_at=now, updated_at=now).on_conflict_do_nothing())
            return True

    def sources_size(self, slug: str, excluding: str | None = None) -> int:
        """The bytes the exam's uploaded sources hold together (less `excluding`'s, which an
        upload replaces)."""
        query = select(func.coalesce(func.sum(F.c.size), 0)).where(F.c.exam == slug)
        if excluding is not None:
            query = query.where(F.c.name != excluding)
        with self._read() as conn:
            return int(conn.execute(query).scalar_one())

    def delete_source(self, slug: str, name: str) -> bool:
        """Remove an uploaded source; False when there was none by that name."""
        with self._write() as conn:
            return conn.execute(delete(F).where(F.c.exam == slug, F.c.name == name)
                                ).rowcount > 0

    def source_file(self, slug: str, name: str) -> bytes | None:
        with self._read() as conn:
            data = conn.execute(select(F.c.data).where(F.c.exam == slug, F.c.name == name)
                                ).scalar()
        return None if data is None else bytes(data)

    def source_names(self, slug: str) -> list[dict[str, Any]]:
        with self._read() as conn:
            rows = conn.execute(select(F.c.name, F.c.size, F.c.sha256, F.c.updated_at)
                                .where(F.c.exam == slug).order_by(F.c.name)).all()
        return [dict(r._mapping) for r in rows]
