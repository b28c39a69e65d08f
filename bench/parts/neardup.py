"""Near-duplicates (issue 12): what the check costs per new question at 500 and at 5,000
stored questions of one chapter, and how often the model repeats itself over a 300-question
chapter with the prompt's old "do not repeat" list (the newest 20) against the steering of
storage.neardup (40 chosen over the whole chapter).

Only when named (`python -m bench --only neardup`): it uses its own in-process mock, in
rewording mode, and SQLite and PostgreSQL databases of its own.

The check time is the commit's near-duplicate work for one batch of 20 new questions,
inside a transaction rolled back afterwards: reading what the scope stored since the last
check, the band-key lookup in the process's index, the verification of the candidates, the
signature rows' insert (their computation, before the transaction, is timed apart: it does
not depend on the chapter's size). The chapter is made of the mock's own questions
(lexically distinct ones, and 10 % rewordings of them, so that lookups find candidates),
indexed as commits index them. The first check of a process builds its index of the chapter
from the stored rows: timed apart, as "index build".

The signing (issue 33): each question's signature and band keys, per question, for replies
of 1, 5, 20 and 100 questions, the group step (`Signed.many`, examforge.neardup.sign_many)
against the commit's path before it and the per-text function, in interleaved rounds of one
process (bench/signing.py, also runnable alone: `python -m bench.signing`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.report import table
from bench.suite import Context, Figure, PartResult

NAME = "neardup"
TITLE = ("near-duplicate check time at 500 vs 5,000 stored; signing per question by reply "
         "size, before and after the group step; repeats with and without steering")
TITLE_TEXT = "Cloud Concepts"
BATCH = 20


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432"


@contextlib.contextmanager
def pg_database(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(f"{PG_ADMIN}/postgres", isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_ADMIN}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _seed_chapter(engine: Any, n: int) -> None:
    from sqlalchemy import insert, text

    from mockllm import questions as mq
    from storage import neardup
    from storage.base import E, Q

    key = "bench/ch"
    texts = [mq.make_question(key, TITLE_TEXT, s)["question"] for s in range(1, n + 1)]
    with engine.begin() as conn:
        conn.execute(insert(E).values(slug="bench", title="Bench", created_at=0.0,
                                      updated_at=0.0))  # its index epoch: the default's
        ids = conn.execute(insert(Q).returning(Q.c.id, sort_by_parameter_order=True), [
            {"exam": "bench", "chapter_id": "ch", "number": i + 1, "question": t,
             "choices": "[]", "answer_index": 0, "explanation": "", "norm_hash": None,
             "model": "m", "call_id": None, "created_at": 0.0}
            for i, t in enumerate(texts)]).scalars().all()
        for start in range(0, n, 1000):
            neardup.index(conn, "bench", "ch", ids[start:start + 1000],
                          neardup.Signed.many(texts[start:start + 1000], TITLE_TEXT))
    with engine.begin() as conn:
        # What autovacuum does for a table that grew this much (PostgreSQL plans the band
        # lookup as a scan of the whole table without statistics); SQLite's planner uses
        # the index either way.
        conn.execute(text("ANALYZE"))


def check_time(db_url: str, stored: int, rounds: int) -> dict[str, float]:
    """Median seconds per new question of the check (in the transaction) and of computing
    its signature (before it), over `rounds` batches of BATCH questions; and the seconds the
    first check took to build the process's index."""
    from examforge.neardup import Checker
    from mockllm import questions as mq
    from storage import connect, migrate, neardup

    engine = connect(db_url)
    migrate(engine)
    _seed_chapter(engine, stored)
    checker = Checker()
    per_q, sign = [], []
    neardup.INDEXES.clear()  # a process's first check: the index is built from the rows
    with engine.connect() as conn, conn.begin():
        t0 = time.perf_counter()
        neardup.check(conn, "bench", "ch", checker, [])
        build = time.perf_counter() - t0
    for r in range(rounds):
        # New questions past the stored ones, a tenth of them rewordings of stored ones.
        serials = range(stored + 1 + r * BATCH, stored + 1 + (r + 1) * BATCH)
        texts = [mq.reword("bench/ch", TITLE_TEXT, 1 + (s * 7919) % stored, s)["question"]
                 if s % 10 == 0 else mq.make_question("bench/ch", TITLE_TEXT, s)["question"]
                 for s in serials]
        t0 = time.perf_counter()
        signed = neardup.Signed.many(texts, TITLE_TEXT)  # as the commit signs a reply
        sign.append((time.perf_counter() - t0) / BATCH)
        with engine.connect() as conn:
            tx = conn.begin()
            t0 = time.perf_counter()
            neardup.lock(conn, "bench", "ch", checker.scope)
            verdict = neardup.check(conn, "bench", "ch", checker, signed)
            kept = [s for s, ok in zip(signed, verdict.keep) if ok]
            neardup.index(conn, "bench", "ch", list(range(10**8 + r * BATCH,
                                                         10**8 + r * BATCH + len(kept))), kept)
            per_q.append((time.perf_counter() - t0) / BATCH)
            tx.rollback()
    engine.dispose()
    return {"check_s": statistics.median(per_q), "signature_s": statistics.median(sign),
            "build_s": build}


def repeat_rate(workdir: Path, steer: str, avoid: int, *, questions: int = 300,
                per_call: int = 20, reword_rate: float = 0.2, seed: int = 0) -> dict[str, Any]:
    """Generate one chapter of `questions` on an in-process mock in rewording mode
    (`producer run`'s code: the pipeline with one thread) and count what the model repeated:
    paraphrases delivered (the mock's own count), rejected as near-duplicates (the ledger's)
    and stored (both a paraphrase and its original in the bank: misses)."""
    from sqlalchemy import select

    from examforge.output import normalise
    from runner.pipeline import Runtime
    from examforge.settings import Settings
    from examforge.syllabus import load_syllabus
    from mockllm import MockConfig, MockServer
    from runner.local import run_local
    from storage import open_store
    from storage.base import K, Q

    folder = Path(tempfile.mkdtemp(prefix=f"neardup-{steer}-", dir=workdir))
    (folder / "ex").mkdir()
    (folder / "ex" / "syllabus.json").write_text(json.dumps({"title": "Bench", "chapters": [
        {"id": "ch", "title": TITLE_TEXT, "questions": questions}]}))
    with MockServer(MockConfig(latency_s=0, reword_rate=reword_rate, seed=seed)) as mock:
        settings = Settings(_env_file=None, database_url=f"sqlite:///{folder / 'ef.db'}",
                            exams_dir=folder, llm_base_url=mock.base_url, llm_api_key="sk-x",
                            questions_per_call=per_call, slice_questions=questions,
                            steer_prompt=steer, avoid_questions=avoid, max_reasks=10,
                            max_attempts=20)
        store = open_store(settings.database_url)
        store.sync_exam("ex", load_syllabus(folder / "ex" / "syllabus.json",
                                            max_questions=questions),
                        slice_questions=questions)
        rt = Runtime.build(settings, store)
        t0 = time.perf_counter()
        try:
            results = run_local(rt, "ex", [("ch", 0)], 1)
        finally:
            rt.close()
        elapsed = time.perf_counter() - t0
        stats = mock.stats()
    with store.engine.connect() as conn:
        stored = {normalise(t) for t in conn.execute(select(Q.c.question)).scalars()}
        details = conn.execute(select(K.c.detail)).scalars().all()
        calls = len(details)
    store.engine.dispose()
    key = "ex/ch"
    rewordings = stats["rewordings"]
    delivered = stats["questions_served_by_chapter"].get(key, 0) + len(rewordings)
    near = sum(int(part.split()[0]) for d in details if d for part in d.split(", ")
               if part.endswith("near_duplicate rejected"))
    both = sum(1 for r in rewordings
               if normalise(r["question"]) in stored and normalise(r["original"]) in stored)
    return {"steer": steer, "avoid": avoid, "outcome": results[("ch", 0)].outcome.value,
            "stored": len(stored), "delivered": delivered, "repeats": len(rewordings),
            "repeat_rate": len(rewordings) / delivered if delivered else 0.0,
            "near_rejected": near, "stored_repeats": both, "calls": calls,
            "calls_paid": stats["calls_total"],
            "avoided": stats["rewordings_avoided_by_chapter"].get(key, 0),
            "seconds": elapsed}


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    rounds = 5 if ctx.small else 25
    sizes = (50, 500) if ctx.small else (500, 5000)
    rows = []
    for dialect in ("sqlite", "postgresql"):
        got = {}
        for n in sizes:
            if dialect == "sqlite":
                url = f"sqlite:///{ctx.workdir / f'neardup-{n}.db'}"
                got[n] = check_time(url, n, rounds)
            else:
                with pg_database(f"efbench_neardup_{n}") as url:
                    got[n] = check_time(url, n, rounds)
            part.runs.append({"dialect": dialect, "stored": n, **got[n]})
            rows.append([dialect, f"{n:,}", f"{got[n]['check_s'] * 1e6:.0f}",
                         f"{got[n]['signature_s'] * 1e6:.0f}",
                         f"{got[n]['build_s'] * 1e3:.1f}"])
        small, big = sizes
        part.figures.append(Figure(
            f"near-duplicate check per new question at {big:,} vs {small} stored ({dialect})",
            got[big]["check_s"] * 1e6, got[small]["check_s"] * 1e6, f"at {small} stored", "µs",
            "near-constant", target_max=1.5))
    part.details += table(("database", "stored", "check µs/question (in the commit)",
                           "signature µs/question (before it)",
                           "index build ms (a process's first check)"), rows)
    part.details.append("")
    from bench import signing

    signed = signing.measure(questions=300 if ctx.small else 3000)
    part.runs.append({"signing_us_per_question": {str(k): v for k, v in signed.items()}})
    for size, us in signed.items():
        part.figures.append(Figure(
            f"signing per question, replies of {size}: the group step vs the path before it",
            us["after"], us["before"], "before issue 33", "µs", "fewer", target_max=1.0))
    part.details += ["Signing per question (median µs; `tokens only` and `keys only` are the "
                     "group step's two halves; bench/signing.py):", ""]
    part.details += signing.report(signed)
    part.details.append("")
    n_questions = 100 if ctx.small else 300
    runs = []
    for steer, avoid in (("recent", 20), ("chapter", 20), ("chapter", 40)):
        for seed in ((0,) if ctx.small else (0, 1, 2)):
            r = repeat_rate(ctx.workdir, steer, avoid, questions=n_questions, seed=seed)
            runs.append({**r, "seed": seed})
            part.runs.append(runs[-1])

    def mean(steer: str, avoid: int) -> float:
        return statistics.mean(r["repeat_rate"] for r in runs
                               if (r["steer"], r["avoid"]) == (steer, avoid)) * 100

    for avoid in (20, 40):
        part.figures.append(Figure(
            f"repeats the model wrote over a {n_questions}-question chapter (% of delivered "
            f"questions): {avoid} listed, chosen over the chapter, vs the newest 20",
            mean("chapter", avoid), mean("recent", 20), "the newest 20", "%", "fewer",
            target_max=1.0))
    part.details += table(
        ("prompt lists", "seed", "delivered", "repeats written", "repeat rate",
         "rejected as near-dup", "stored repeats (missed)", "paid calls", "avoided"),
        [[f"{r['steer']} {r['avoid']}", r["seed"], r["delivered"], r["repeats"],
          f"{r['repeat_rate']:.1%}", r["near_rejected"], r["stored_repeats"], r["calls_paid"],
          r["avoided"]] for r in runs])
    return part
