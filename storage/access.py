"""Access: the API's named tokens and the audit (migration 0030).

Tokens are stored as a hash only (producer/access.py makes them and says why a plain
SHA-256 is enough); a request's token is looked up by its hash on every request, live rows
only, so a revocation holds on every replica from the next request on, with no cache to
expire. `last_used_at` is written at most once per `touch_s` per token: a write per request
would make every read of the API a write transaction (SQLite has one writer at a time).

The audit is append-only, read newest first in keyset pages by id (as `exam_page` pages by
(created_at, slug)): a row recorded while a client pages comes before its first page, so
nothing is skipped or listed twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update

from examforge.errors import BadCursor
from storage.base import StoreBase
from storage.models import ApiToken, AuditEvent

T = ApiToken.__table__  # type: ignore[attr-defined]
A = AuditEvent.__table__  # type: ignore[attr-defined]
AUDIT_PAGE = 100  # audit rows on a page, unless asked otherwise


@dataclass(frozen=True)
class TokenRow:
    """A named token as stored: never its secret, only the hash."""

    id: int
    name: str
    role: str
    exams: list[str] | None  # None: every exam
    token_hash: str
    created_by: str
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


@dataclass(frozen=True)
class AuditRow:
    id: int
    at: float
    actor: str
    action: str
    exam: str | None
    details: dict[str, Any] | None
    outcome: str


def _token(r: Any) -> TokenRow:
    return TokenRow(id=r.id, name=r.name, role=r.role,
                    exams=json.loads(r.exams) if r.exams is not None else None,
                    token_hash=r.token_hash, created_by=r.created_by, created_at=r.created_at,
                    last_used_at=r.last_used_at, revoked_at=r.revoked_at)


# An audit row's place in the keyset order: its id, in decimals. Every string of that form is
# a place (a page from there); the API's document says so (AUDIT_CURSOR_PATTERN, issue 30).
AUDIT_CURSOR_PATTERN = r"^[1-9][0-9]{0,17}$"
_AUDIT_CURSOR_RE = re.compile(AUDIT_CURSOR_PATTERN)


def encode_audit_cursor(row_id: int) -> str:
    """An audit row's place in the keyset order, opaque to clients (AUDIT_CURSOR_PATTERN)."""
    return str(row_id)


def decode_audit_cursor(cursor: str) -> int:
    if not isinstance(cursor, str) or not _AUDIT_CURSOR_RE.fullmatch(cursor):
        raise BadCursor(f"after: {str(cursor)[:80]!r} is not a cursor a page of the audit gave "
                        "(use its `next`)")
    return int(cursor)


class Access(StoreBase):
    """Named tokens and the audit."""

    # --- tokens --------------------------------------------------------------------------

    def add_token(self, name: str, role: str, exams: list[str] | None, token_hash: str,
                  created_by: str) -> TokenRow | None:
        """Store a new live token; None when a live token has that name already (the
        partial UNIQUE index decides, also between two `token add` at once)."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            new_id = conn.execute(
                self._insert(T).values(
                    name=name, role=role, token_hash=token_hash, created_by=created_by,
                    exams=None if exams is None else json.dumps(sorted(set(exams))),
                    created_at=now)
                .on_conflict_do_nothing().returning(T.c.id)).scalar()
            if new_id is None:
                return None
            return _token(conn.execute(select(T).where(T.c.id == new_id)).one())

    def tokens(self, *, revoked: bool = False) -> list[TokenRow]:
        """The live tokens by name (`revoked`: the revoked ones too, after them)."""
        query = select(T).order_by(T.c.revoked_at.is_not(None), T.c.name, T.c.id)
        if not revoked:
            query = query.where(T.c.revoked_at.is_(None))
        with self._read() as conn:
            return [_token(r) for r in conn.execute(query)]

    def live_token_count(self) -> int:
        with self._read() as conn:
            return len(conn.execute(select(T.c.id).where(T.c.revoked_at.is_(None))
                                    .limit(1000)).all())

    def revoke_token(self, name: str) -> TokenRow | None:
        """End the live token `name` now; None if there is none by that name."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            row_id = conn.execute(
                update(T).where(T.c.name == name, T.c.revoked_at.is_(None))
                .values(revoked_at=now).returning(T.c.id)).scalar()
            if row_id is None:
                return None
            return _token(conn.execute(select(T).where(T.c.id == row_id)).one())

    def live_token(self, token_hash: str) -> TokenRow | None:
        """The live token with this hash, read now (never cached: see the module)."""
        with self._read() as conn:
            row = conn.execute(select(T).where(T.c.token_hash == token_hash,
                                               T.c.revoked_at.is_(None))).first()
        return None if row is None else _token(row)

    def touch_token(self, token_id: int, touch_s: float) -> None:
        """Record a use of the token, unless one was recorded in the last `touch_s`."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            conn.execute(update(T).where(
                T.c.id == token_id,
                or_(T.c.last_used_at.is_(None), T.c.last_used_at < now - touch_s))
                .values(last_used_at=now))

    # --- audit ---------------------------------------------------------------------------

    def record_audit(self, actor: str, action: str, exam: str | None,
                     details: dict[str, Any] | None, outcome: str) -> int:
        """Append one audit row (its own transaction: an action that failed and rolled
        back is still recorded, as failed)."""
        with self._write() as conn:
            now = conn.execute(select(self._now)).scalar_one()
            return int(conn.execute(self._insert(A).values(
                at=now, actor=actor[:96], action=action, exam=exam, outcome=outcome,
                details=None if details is None else json.dumps(details, sort_keys=True,
                                                                ensure_ascii=False))
                .returning(A.c.id)).scalar_one())

    def audit_page(self, *, exam: str | None = None, since: float | None = None,
                   exams: list[str] | None = None, limit: int = AUDIT_PAGE,
                   after: str | None = None) -> tuple[list[AuditRow], str | None]:
        """Audit rows newest first, after the cursor `after`, at most `limit`, with the
        cursor of the next page (None on the last). `exam`: that exam's rows; `since`: rows
        at or after that time (the database's clock, epoch seconds)."""
        query = select(A).order_by(A.c.id.desc()).limit(limit + 1)
        if after is not None:
            query = query.where(A.c.id < decode_audit_cursor(after))
        if exam is not None:
            query = query.where(A.c.exam == exam)
        if since is not None:
            query = query.where(A.c.at >= since)
        with self._read() as conn:
            rows = conn.execute(query).all()
        items = [AuditRow(id=r.id, at=r.at, actor=r.actor, action=r.action, exam=r.exam,
                          details=json.loads(r.details) if r.details else None,
                          outcome=r.outcome) for r in rows[:limit]]
        more = len(rows) > limit
        return items, encode_audit_cursor(items[-1].id) if more else None

    def database_now(self) -> float:
        """The database's clock (what audit times are on), epoch seconds."""
        with self._read() as conn:
            return float(conn.execute(select(self._now)).scalar_one())
