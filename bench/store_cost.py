"""What the store costs per paid call, on its own: SQLite against PostgreSQL.

    python bench/store_cost.py [--chapters 40] [--per-chapter 50] [--per-call 10]
        [--pg postgresql://postgres@127.0.0.1:5432]

Runs the worker's database work for each call (`start_call`, then `commit_batch` of one batch;
one `claim` per chapter) in one thread, with no model and no broker, and prints CPU and wall
milliseconds per call for each database, with SQLAlchemy's `pool_pre_ping` on (as shipped) and
off. A fresh SQLite file and a fresh PostgreSQL database (dropped afterwards) are used.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from examforge.output import Question
from examforge.syllabus import Chapter, Syllabus
from storage import Store, connect, migrate
from storage.store import Claimed, Usage


def measure(url: str, pre_ping: bool, chapters: int, per_chapter: int, per_call: int
            ) -> tuple[float, float]:
    engine = connect(url)
    engine.pool._pre_ping = pre_ping  # the only switch SQLAlchemy offers after creation
    migrate(engine)
    store = Store(engine)
    syllabus = Syllabus(title="Store cost", chapters=[
        Chapter(id=f"c{i}", title=f"Chapter {i}", questions=per_chapter)
        for i in range(chapters)])
    store.sync_exam("bench", syllabus)
    calls = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(chapters):
        claim = store.claim("bench", f"c{i}", "bench-worker", 30.0, 8)
        assert isinstance(claim, Claimed), claim
        for first in range(1, per_chapter + 1, per_call):
            call_id = store.start_call(claim, first, per_call, lease_s=30.0)
            assert isinstance(call_id, int)
            batch = [Question(f"q {i}.{first + j}?", ("a", "b", "c", "d"), 0, "")
                     for j in range(per_call)]
            store.commit_batch(claim, 30.0, call_id, batch,
                               model="m", usage=Usage(10, 20, 0.0))
            calls += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    engine.dispose()
    return cpu / calls * 1000, wall / calls * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chapters", type=int, default=40)
    ap.add_argument("--per-chapter", type=int, default=50)
    ap.add_argument("--per-call", type=int, default=10)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    args = ap.parse_args()
    admin = create_engine(f"{args.pg}/postgres", isolation_level="AUTOCOMMIT")
    print("database    pre_ping  CPU ms/call  wall ms/call")
    for pre_ping in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            cpu, wall = measure(f"sqlite:///{Path(tmp) / 'bench.db'}", pre_ping,
                                args.chapters, args.per_chapter, args.per_call)
        print(f"sqlite      {pre_ping!s:8}  {cpu:11.2f}  {wall:12.2f}")
        name = f"efbench_store_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            cpu, wall = measure(f"{args.pg}/{name}", pre_ping,
                                args.chapters, args.per_chapter, args.per_call)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        print(f"postgresql  {pre_ping!s:8}  {cpu:11.2f}  {wall:12.2f}")


if __name__ == "__main__":
    main()
