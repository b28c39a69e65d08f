"""The lease keeper: one thread per process renews every lease the process holds.

One batched UPDATE per beat (not one thread per chapter) so a worker with 128 threads costs
one statement per interval. A lease whose renewal fails is marked lost; the chapter's thread
sees it before its next call and before its commit (the commit is fenced in SQL anyway).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError

from examforge.errors import DatabaseCorrupt
from storage.store import Store

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, store: Store, lease_s: float, interval_s: float) -> None:
        self._store = store
        self._lease_s = lease_s
        self._interval_s = interval_s
        self._held: dict[str, threading.Event] = {}  # owner -> "lost" flag
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, owner: str) -> threading.Event:
        """Start renewing `owner`'s lease; the returned event is set if the lease is lost."""
        lost = threading.Event()
        with self._lock:
            self._held[owner] = lost
            if not self._stopped.is_set() and (self._thread is None
                                               or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name="lease-keeper",
                                                daemon=True)
                self._thread.start()
        return lost

    def held(self) -> int:
        """How many leases this process holds now: its running slices. Read without the lock
        (a dict's length is one atomic read), so that a signal handler may ask."""
        return len(self._held)

    def drop(self, owner: str) -> None:
        with self._lock:
            self._held.pop(owner, None)

    def beat(self) -> None:
        """Renew every held lease once (also called directly by tests)."""
        with self._lock:
            owners = list(self._held)
        if not owners:
            return
        try:
            alive = self._store.renew(owners, self._lease_s)
        except (SQLAlchemyError, DatabaseCorrupt) as exc:
            # A slow or restarting database: keep trying; the TTL is four beats long so one or
            # two missed beats do not expire anything, and the commit is fenced regardless.
            # (A damaged database: the task that holds the lease stops the worker.)
            log.warning("lease renewal failed: %s", str(exc).splitlines()[0])
            return
        with self._lock:
            for owner in owners:
                if owner not in alive and owner in self._held:
                    log.warning("lease lost", extra={"owner": owner})
                    self._held[owner].set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the renewal thread (a process shutting down, a test finishing); the leases it
        held then expire on their own."""
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if not self._stopped.is_set():
                self.beat()
