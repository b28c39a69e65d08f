"""The SQLite writer turn's fast lane: the heartbeat goes right after the current holder,
before every writer that queued earlier."""

from __future__ import annotations

import sys
import threading

from helpers import wait_for

from storage.base import WriterLock


def _waiting(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    while frame is not None:
        if frame.f_code is WriterLock._enter.__code__:
            return True
        frame = frame.f_back
    return False


def test_an_urgent_waiter_goes_before_writers_that_queued_earlier() -> None:
    lock = WriterLock()
    order: list[str] = []
    release = threading.Event()

    def holder() -> None:
        with lock.hold():
            order.append("holder")
            release.wait(10)

    def writer(name: str, urgent: bool = False) -> None:
        with lock.hold(urgent):
            order.append(name)

    first = threading.Thread(target=holder)
    first.start()
    wait_for(lambda: order == ["holder"], 5, "the holder to take the lock")
    queued = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(8)]
    for t in queued:
        t.start()
    # Each normal writer is waiting for its turn (it cannot have it: it is held): inside
    # WriterLock._enter, which returns only with the turn taken.
    wait_for(lambda: all(_waiting(t) for t in queued), 5, "eight writers to wait")
    beat = threading.Thread(target=writer, args=("heartbeat", True))
    beat.start()
    wait_for(lambda: lock._urgent == 1, 5, "the heartbeat to wait")
    release.set()
    for t in [first, *queued, beat]:
        t.join(10)
    assert order[:2] == ["holder", "heartbeat"]
    assert sorted(order[2:]) == [f"w{i}" for i in range(8)]


def test_without_urgent_waiters_it_is_a_plain_mutual_exclusion() -> None:
    lock = WriterLock()
    inside = 0
    peak = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, peak
        for _ in range(200):
            with lock.hold():
                with guard:
                    inside += 1
                    peak = max(peak, inside)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak == 1
