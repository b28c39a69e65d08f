"""For issue 16 (item 14): what a syllabus of many chapters costs, to set the caps README's
"Hostile or odd input" table states. For 20,000 and 50,000 chapters of 1 question each, on
SQLite and PostgreSQL, it times `enqueue` (parse, validate, record, publish), `status`
(table and --json), one reconciler pass, and the HTTP API's page data (GET /exams/SLUG, GET
/exams, PUT of the syllabus) in-process, each in a process of its own: wall time and peak
memory (`/usr/bin/time`'s maximum resident set size). With --generate it also runs the
exam end to end (`producer run`, the mock at zero latency).

    python -m bench.syllabus_size                         # 20k and 50k, both databases
    python -m bench.syllabus_size --chapters 20000 --db sqlite --generate

Syllabi over the caps of examforge.syllabus (50,000 chapters do not fit in 1 MB of JSON)
are read with the caps lifted in the measured process (`--uncapped`), so the figures say
what the rest of the system would do with them. Needs Redis (db 12, flushed) and, for
PostgreSQL, the server on 127.0.0.1:5432 with trust auth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.measure import child_pythonpath

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def lift_caps() -> None:
    """In a measured process: no byte cap and no chapter cap, so a syllabus over them can be
    measured (pydantic bakes max_length into the model: rebuilt without it)."""
    import annotated_types

    from examforge import syllabus

    syllabus.MAX_SYLLABUS_BYTES = 10**9
    field = syllabus.Syllabus.model_fields["chapters"]
    field.metadata = [m for m in field.metadata if not isinstance(m, annotated_types.MaxLen)]
    syllabus.Syllabus.model_rebuild(force=True)


def write_syllabus(exams_dir: Path, slug: str, chapters: int) -> int:
    """N chapters of one question each, ids and titles as short as a real one's; bytes."""
    data = {"title": f"{chapters} chapters", "chapters": [
        {"id": f"c{i}", "title": f"T {i}", "questions": 1} for i in range(chapters)]}
    folder = exams_dir / slug
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, separators=(",", ":")).encode()
    (folder / "syllabus.json").write_bytes(raw)
    return len(raw)


def timed(argv: list[str], env: dict[str, str], timeout: float = 3600) -> dict[str, Any]:
    """Wall seconds and peak RSS (MB) of one process."""
    started = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    wall = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    rss_kb = int(lines[-1]) if lines and lines[-1].isdigit() else 0
    return {"s": round(wall, 2), "mb": round(rss_kb / 1024), "rc": proc.returncode,
            "out": proc.stdout[-300:], "err": "\n".join(lines[:-1])[-300:]}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.syllabus_size", "--uncapped-cli", *args]


def api_script(slug: str, body_path: Path) -> list[str]:
    code = f"""
import json, sys, time
from bench.syllabus_size import lift_caps
lift_caps()
from fastapi.testclient import TestClient
from examforge.settings import load_settings
from producer.api import create_app
app = create_app(load_settings(), local=True, no_auth=True)
out = {{}}
with TestClient(app) as c:
    for name, path in (("GET /exams/SLUG", "/exams/{slug}"), ("GET /exams", "/exams")):
        t = time.monotonic(); r = c.get(path); r.raise_for_status()
        out[name] = [round(time.monotonic() - t, 2), len(r.content)]
    body = open({str(body_path)!r}, 'rb').read()
    t = time.monotonic()
    r = c.put("/exams/{slug}-put", content=body, headers={{"Content-Type": "application/json"}})
    out["PUT /exams/SLUG"] = [round(time.monotonic() - t, 2), r.status_code]
print(json.dumps(out))
"""
    return [sys.executable, "-c", code]


def measure(chapters: int, database: str, generate: bool, redis_url: str) -> dict[str, Any]:
    import psycopg
    import redis

    from mockllm import MockConfig, MockServer

    redis.Redis.from_url(redis_url).flushdb()
    work = Path(tempfile.mkdtemp(prefix="ef-size-"))
    exams = work / "exams"
    slug = f"size-{chapters}"
    size = write_syllabus(exams, slug, chapters)
    pg_name = None
    if database == "sqlite":
        url = f"sqlite:///{work / 'examforge.db'}"
    else:
        pg_name = f"efbench_size_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{pg_name}"
    mock = MockServer(MockConfig(latency_s=0.0))
    base_url = mock.start()
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "DATABASE_URL": url, "BROKER_URL": redis_url,
           "EXAMS_DIR": str(exams), "LLM_BASE_URL": base_url, "LLM_API_KEY": "sk-bench",
           "TASK_QUEUE": f"efsize-{uuid.uuid4().hex[:6]}", "QUESTIONS_PER_CALL": "1"}
    row: dict[str, Any] = {"chapters": chapters, "database": database, "bytes": size}
    try:
        row["migrate"] = timed(cli("migrate"), env)
        row["enqueue"] = timed(cli("enqueue", slug), env)
        row["enqueue again"] = timed(cli("enqueue", slug), env)
        row["status"] = timed(cli("status", slug), env)
        row["status --json"] = timed(cli("status", slug, "--json"), env)
        row["reconcile"] = timed(cli("reconcile"), env)
        api = timed(api_script(slug, exams / slug / "syllabus.json"), env)
        row["api process"] = {k: api[k] for k in ("s", "mb", "rc", "err")}
        if api["rc"] == 0:
            row["api"] = json.loads(api["out"].strip().splitlines()[-1])
        if generate:
            redis.Redis.from_url(redis_url).flushdb()
            row["run"] = timed(cli("run", slug, "--concurrency", "8"), env)
            row["run"]["mock_calls"] = mock.stats()["calls_total"]
            row["status done"] = timed(cli("status", slug, "--json"), env)
            row["export"] = timed(cli("export", slug, "-o", str(work / "out.jsonl")), env)
    finally:
        mock.stop()
        if pg_name is not None:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
    return row


def report(rows: list[dict[str, Any]]) -> str:
    steps = ["enqueue", "enqueue again", "status", "status --json", "reconcile", "api process",
             "run", "status done", "export"]
    lines = ["| chapters (bytes) | database | " + " | ".join(s for s in steps) + " |",
             "|---" * (len(steps) + 2) + "|"]
    for r in rows:
        cells = []
        for s in steps:
            m = r.get(s)
            cells.append("-" if m is None else
                         f"{m['s']} s, {m['mb']} MB" + ("" if m["rc"] == 0 else f" (exit {m['rc']})"))
        lines.append(f"| {r['chapters']:,} ({r['bytes']:,}) | {r['database']} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| chapters | database | GET /exams/SLUG (s, bytes) | GET /exams (s, bytes) | "
                 "PUT /exams/SLUG (s, status) |")
    lines.append("|---|---|---|---|---|")
    for r in rows:
        a = r.get("api", {})
        lines.append(f"| {r['chapters']:,} | {r['database']} | {a.get('GET /exams/SLUG')} | "
                     f"{a.get('GET /exams')} | {a.get('PUT /exams/SLUG')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--uncapped-cli":
        lift_caps()
        from producer.cli import main as cli_main

        sys.exit(cli_main(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", default="20000,50000")
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--generate", action="store_true")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL",
                                                              "redis://127.0.0.1:6379/12"))
    parser.add_argument("--results", default=str(ROOT / "bench" / "results-size.md"))
    args = parser.parse_args()
    rows = []
    for chapters in (int(c) for c in args.chapters.split(",")):
        for database in args.db.split(","):
            row = measure(chapters, database, args.generate, args.redis_url)
            print(json.dumps(row), flush=True)
            rows.append(row)
    text = report(rows)
    Path(args.results).write_text(text)
    Path(args.results).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
