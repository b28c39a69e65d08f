"""The SQLite writer turn's fast lane: the heartbeat goes right after the current holder,
before every writer that queued earlier."""

from __future__ import annotations

import threading

from helpers import wait_for

from storage.base import WriterLock


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
    # Each normal writer is waiting on the condition (it cannot have the lock: it is held).
    wait_for(lambda: len(lock._cond._waiters) == 8, 5, "eight writers to wait")  # type: ignore[attr-defined]
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
