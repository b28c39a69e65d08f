"""`python -m producer enqueue` of a 10,000-chapter exam against a naive loop of 10,000
`apply_async` calls on the same broker (issue 8, row 6). No worker runs: the queue is only
filled, counted and flushed. Both are timed from process launch to exit (interpreter start-up
and imports included in both); the database is migrated beforehand, so the enqueue pays for
recording the exam and its chapters, not for creating the schema."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.measure import PG_ADMIN_URL, ROOT, flush_redis, wait_child, write_syllabus
from bench.report import table
from bench.suite import Context, Figure, PartResult
from bench.systems.embedded import ef_env

NAME = "enqueue"
TITLE = "enqueue of a 10,000-chapter exam against a naive apply_async loop"


def _queue_len(redis_url: str, queue: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen(queue))
    finally:
        client.close()


def _timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float, str]:
    # Output to a file, not a pipe: enqueue prints a line per chapter, more than a pipe holds.
    with open(log, "wb") as f:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        usage = wait_child(proc, 600, started=started)
    out = log.read_text(errors="replace")
    if usage.code != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} exit {usage.code}: {out[-800:]}")
    return usage.wall_s, usage.cpu_s, out


def naive_main(argv: list[str]) -> int:
    """`python -m bench.parts.enqueue SLUG N`: N apply_async calls of examforge's chapter task,
    one after the other, with their deterministic task ids (what a first version would do)."""
    from bench.measure import chapter_id
    from tasks.app import generate_chapter
    from tasks.broker import task_id

    slug, n = argv[0], int(argv[1])
    t0 = time.monotonic()
    for i in range(n):
        cid = chapter_id(i)
        generate_chapter.apply_async((slug, cid), task_id=task_id(slug, cid))
    print(json.dumps({"loop_s": time.monotonic() - t0}))
    return 0


def run(ctx: Context) -> PartResult:
    part = PartResult(NAME, TITLE)
    chapters = 300 if ctx.small else 10_000
    databases = ("sqlite",) if ctx.small else ("sqlite", "postgres")
    rows = []
    for database in databases:
        queue = f"efbench-{uuid.uuid4().hex[:8]}"
        pg_db = None
        if database == "postgres":
            import psycopg

            pg_db = f"efbench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{pg_db}"')
            db_url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{pg_db}"
        else:
            db_url = f"sqlite:///{ctx.workdir / f'enqueue-{queue}.db'}"
        env = ef_env(ctx.workdir, db_url, ctx.mock.url, 5, queue, ctx.redis_url)
        try:
            flush_redis(ctx.redis_url)
            subprocess.run([sys.executable, "-m", "producer", "migrate"], cwd=ROOT, env=env,
                           check=True, capture_output=True, timeout=120)
            slug = f"enq-{uuid.uuid4().hex[:6]}"
            write_syllabus(ctx.workdir / "exams", slug, [5] * chapters)
            ef_wall, ef_cpu, _ = _timed([sys.executable, "-m", "producer", "enqueue", slug], env,
                                        ctx.workdir / f"{slug}.log")
            ef_msgs = _queue_len(ctx.redis_url, queue)
            flush_redis(ctx.redis_url)
            naive_wall, naive_cpu, out = _timed(
                [sys.executable, "-m", "bench.parts.enqueue", f"naive-{slug}", str(chapters)],
                env, ctx.workdir / f"naive-{slug}.log")
            naive_msgs = _queue_len(ctx.redis_url, queue)
            loop_s = json.loads(out.strip().splitlines()[-1])["loop_s"]
        finally:
            flush_redis(ctx.redis_url)
            if pg_db is not None:
                import psycopg

                with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
        if ef_msgs != chapters or naive_msgs != chapters:
            raise RuntimeError(f"{database}: queue held {ef_msgs} / {naive_msgs} messages "
                               f"for {chapters} chapters")
        part.runs.append({"database": database, "chapters": chapters,
                          "enqueue_wall_s": ef_wall, "enqueue_cpu_s": ef_cpu,
                          "enqueue_messages": ef_msgs, "naive_wall_s": naive_wall,
                          "naive_cpu_s": naive_cpu, "naive_loop_s": loop_s,
                          "naive_messages": naive_msgs})
        rows.append([database, chapters, f"{ef_wall:.2f}", f"{ef_cpu:.2f}",
                     f"{chapters / ef_wall:,.0f}", f"{naive_wall:.2f}", f"{loop_s:.2f}",
                     f"{ef_wall / naive_wall:.2f}"])
        part.figures.append(Figure(
            f"`producer enqueue` of {chapters:,} chapters ({database}) vs a naive loop of "
            f"{chapters:,} apply_async, launch to exit", ef_wall, naive_wall, "naive loop", "s",
            "< 1.0x (faster than the naive loop)", target_max=1.0))
        part.figures.append(Figure(
            f"enqueue rate ({database}), chapters/s, vs the moonshot's 10,000/s",
            chapters / ef_wall, 10_000, "moonshot", "chapters/s", "moonshot ≥ 1.0x",
            target_min=None))
    part.details += table(("database", "chapters", "enqueue s (launch → exit)", "enqueue CPU s",
                           "chapters/s", "naive loop s (launch → exit)",
                           "naive loop s (the loop alone)", "ratio"), rows)
    part.details += ["", ("Both commands leave exactly one message per chapter in the queue "
                     "(counted with LLEN); the naive loop also records nothing in the database.")]
    return part


if __name__ == "__main__":
    raise SystemExit(naive_main(sys.argv[1:]))
