"""Who may do what: roles, named tokens, the caller (`Principal`) and the audit helper.

Roles, each including the one before (issue 30):

    reader    reads exams, questions, runs, exports and metrics
    reviewer  + approves, rejects and edits questions
    operator  + puts syllabi and sources, starts and cancels runs, sets budgets
    admin     everything, on every exam (the audit; an admin token has no exam scope)

A token is `ef_` and 32 random bytes (256 bits, URL-safe base64). The database keeps its
SHA-256 only. A plain hash, no server key: a keyed hash (HMAC) protects secrets that could
be guessed, and one guess at a 256-bit random token is as hopeless as another; without a
key there is no key to lose, rotate or share between replicas, and a stolen database
still gives no token. The stored hash is compared with `hmac.compare_digest`.

The tokens of API_TOKENS are admin tokens of every exam, named as the review history has
named them since 0023: a hash of the token (`client_of`), so the history reads the same
before and after.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterator

from examforge.errors import UserError

TOKEN_PREFIX = "ef_"
# A token's last use is written at most this often, seconds (`token list` is that precise).
TOKEN_TOUCH_S = 60.0
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
# The names of API_TOKENS' tokens (32 hex digits, `client_of`): never a named token's.
_HASH_NAME_RE = re.compile(r"^[0-9a-f]{32}$")


class Role(str, Enum):
    """A token's role; each includes the ones before it."""

    reader = "reader"
    reviewer = "reviewer"
    operator = "operator"
    admin = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Principal:
    """The caller of a request: its name (shown in the history and the audit), role, and
    the exams it may see (None: every exam)."""

    name: str
    role: Role
    exams: frozenset[str] | None = None
    token_id: int | None = None  # a named token's row (None: API_TOKENS, or no auth)

    def sees(self, exam: str) -> bool:
        return self.exams is None or exam in self.exams

    def as_dict(self) -> dict[str, Any]:
        """GET /me."""
        return {"name": self.name, "role": self.role.value,
                "exams": None if self.exams is None else sorted(self.exams)}


# Whoever calls a server run with --no-auth (loopback only): it can do everything.
NO_AUTH = Principal("no-auth", Role.admin)


def new_token() -> str:
    """A fresh token: shown once, never stored."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the database keeps of a token (see the module's docstring)."""
    return hashlib.sha256(token.encode()).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def check_token_name(name: str) -> str:
    """A token's name, or UserError: it is shown in tables and the history."""
    if not NAME_RE.fullmatch(name):
        raise UserError(f"token name {name!r}: use 1 to 64 letters, digits, '.', '_', '@' or "
                        "'-', starting with a letter or digit")
    if _HASH_NAME_RE.fullmatch(name):
        raise UserError(f"token name {name!r}: 32 hex digits name the tokens of API_TOKENS; "
                        "choose another")
    return name


def cli_actor() -> str:
    """Who runs a command, for the audit: the local user."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (a bare container)
        return "cli:unknown"


@contextlib.contextmanager
def audited(store: Any, actor: str, action: str, exam: str | None,
            details: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Record `action` once its block ends: `ok`; `refused` for a user's error (a bad
    input, a conflict: the API's 4xx); `failed` for any other error (raised on, in both
    cases, with the error in the details). The block may add to the yielded details, or
    set `outcome` itself."""
    note: dict[str, Any] = {"details": dict(details or {}), "outcome": "ok"}
    try:
        yield note
    except BaseException as exc:
        note["outcome"] = "refused" if isinstance(exc, UserError) else "failed"
        note["details"]["error"] = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        store.record_audit(actor, action, exam, note["details"] or None, note["outcome"])
