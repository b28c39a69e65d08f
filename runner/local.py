"""`producer run`: the embedded mode. Same claim / call / commit code as the workers, with a
thread pool instead of a broker: each slice is a job of the pool, so the slices of one chapter
run at once here too. Killed and started again, it resumes from the database."""

from __future__ import annotations

import heapq
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable

from runner.pipeline import ChapterResult, Runtime, process_chapter


Slice = tuple[str, int]  # (chapter_id, slice_no)


def run_local(rt: Runtime, exam: str, slices: list[Slice], concurrency: int,
              on_progress: Callable[[], None] | None = None,
              more: Callable[[], list[Slice]] | None = None) -> dict[Slice, ChapterResult]:
    """Process slices until each is done, failed or skipped; transient failures are retried
    after the delay the pipeline asks for (backoff, Retry-After, another holder's lease).
    `more`, asked at every turn of the loop, gives slices to add (serve --local: a new run of
    an exam this process already works on); one already waiting or running is not added
    twice."""
    ready: list[tuple[float, int, Slice]] = [(0.0, i, s) for i, s in enumerate(slices)]
    heapq.heapify(ready)
    results: dict[Slice, ChapterResult] = {}
    running: dict[Future[ChapterResult], Slice] = {}
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="chapter") as pool:
        try:
            _loop(rt, exam, pool, ready, running, results, concurrency, on_progress, more)
            _drain(running, results, on_progress)
        except BaseException:
            # Ctrl-C, SIGTERM or a crash: running chapters finish the call they are in, commit
            # it and stop; the pool's exit waits for exactly that, no more paid calls.
            rt.stopping.set()
            raise
    return results


def _loop(rt: Runtime, exam: str, pool: ThreadPoolExecutor,
          ready: list[tuple[float, int, Slice]], running: dict[Future[ChapterResult], Slice],
          results: dict[Slice, ChapterResult], concurrency: int,
          on_progress: Callable[[], None] | None,
          more: Callable[[], list[Slice]] | None = None) -> None:
    """Submit ready chapters, collect results, re-schedule retries at their delay, until
    nothing is left or `rt.stopping` is set (Ctrl-C, SIGTERM, a server's shutdown): then
    nothing more is submitted, and `_drain` waits for the running slices, which hand back
    after the call each is in."""
    seq = len(ready) + len(running) + len(results)
    while not rt.stopping.is_set():
        if more is not None:
            live = {ref for _, _, ref in ready} | set(running.values())
            for ref in more():
                if ref not in live:
                    live.add(ref)
                    results.pop(ref, None)
                    seq += 1
                    heapq.heappush(ready, (0.0, seq, ref))
        if not (ready or running):
            break
        now = time.monotonic()
        while ready and ready[0][0] <= now and len(running) < concurrency:
            _, _, ref = heapq.heappop(ready)
            running[pool.submit(process_chapter, rt, exam, *ref)] = ref
        timeout = max(0.0, ready[0][0] - now) if ready else None
        if running:
            finished, _ = wait(running, timeout=min(timeout or 1.0, 1.0),
                               return_when=FIRST_COMPLETED)
        else:
            finished = set()
            time.sleep(min(timeout or 0.1, 1.0))
        for fut in finished:
            ref = running.pop(fut)
            result = fut.result()
            if result.outcome in ("retry", "lost"):
                # "lost": our lease expired (a stalled database, another process took the
                # chapter); come back and claim again, or find it done.
                seq += 1
                heapq.heappush(ready, (time.monotonic() + (result.retry_in_s or 1.0), seq, ref))
            else:
                results[ref] = result
        if on_progress:
            on_progress()


def _drain(running: dict[Future[ChapterResult], Slice], results: dict[Slice, ChapterResult],
           on_progress: Callable[[], None] | None) -> None:
    """Wait for the running slices after a stop (each ends after the call it is in, committed
    or booked) and keep their results: a stop is a flag the loop reads, never an exception
    raised into whatever the main thread was doing (a KeyboardInterrupt raised inside a
    finaliser or a library's cleanup is printed and dropped by Python, and the stop with it)."""
    while running:
        finished, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
        for fut in finished:
            results[running.pop(fut)] = fut.result()
        if on_progress:
            on_progress()
