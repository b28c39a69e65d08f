"""A damaged database is refused in one line, with a way back (issue 16, item 13): real
SQLite files of real runs, damaged on disk; PostgreSQL's data-corruption errors; the worker
and the API; and `producer backup`, restored mid-run."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e

EXIT_DAMAGED = 4  # docs/reference/cli.md: exit codes; examforge.errors.DatabaseCorrupt.exit_code


def _db_path(dep: Any) -> Path:
    return Path(dep.env["DATABASE_URL"].removeprefix("sqlite:///"))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real database with rows, made once for the module: an exam of 24 chapters of 10
    questions generated against the mock by the pipeline `producer run` uses (in this
    process: a subprocess per test would cost seconds each)."""
    from runner.pipeline import Runtime
    from examforge.settings import Settings
    from examforge.syllabus import parse_syllabus
    from mockllm import MockConfig, MockServer
    from runner.local import run_local
    from storage import open_store

    folder = tmp_path_factory.mktemp("generated")
    path = folder / "examforge.db"
    with MockServer(MockConfig(latency_s=0.0)) as mock:
        settings = Settings(_env_file=None, database_url=f"sqlite:///{path}",
                            llm_base_url=mock.base_url, llm_api_key="sk-e2e",
                            questions_per_call=5, exams_dir=folder)
        store = open_store(settings.database_url, pool_size=4)
        syllabus = parse_syllabus(json.dumps({"title": "Ex", "chapters": [
            {"id": f"c{i}", "title": f"Chapter {i}", "questions": 10} for i in range(24)]}
        ).encode(), "syllabus.json", max_questions=100)
        plan = store.sync_exam("ex", syllabus, slice_questions=settings.slice_questions)
        rt = Runtime.build(settings, store)
        results = run_local(rt, "ex", plan.slices, 8)
        rt.close()
        assert {r.outcome for r in results.values()} == {"done"}, results
        store.engine.dispose()
    with sqlite3.connect(path) as conn:  # everything in the main file, none in the -wal
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _copy_of(generated: Path, dep: Any) -> Path:
    """The generated database as `dep`'s own, with its exam's syllabus in EXAMS_DIR."""
    dep.syllabus("ex", {"title": "Ex", "chapters": [
        {"id": f"c{i}", "title": f"Chapter {i}", "questions": 10} for i in range(24)]})
    path = _db_path(dep)
    shutil.copyfile(generated, path)
    return path


def damage_page(path: Path, btree: str) -> int:
    """Write garbage over the page of `btree` (a table or index) nearest the middle of the
    file: a torn write, a bad sector. Returns the page number."""
    with sqlite3.connect(path) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        pages = [p for (p,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (btree,))]
    assert pages, f"{btree} has no leaf page"
    page = min(pages, key=lambda p: abs(p - count / 2))
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(os.urandom(size))
    return page


def _assert_one_line(result: subprocess.CompletedProcess[str], database: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_DAMAGED, (result.returncode, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: database "), output[-3000:]
    line = lines[0]
    assert database in line and "is damaged" in line, line
    assert "restore the last backup" in line and "doctor" in line, line
    return line


def damage_questions(path: Path) -> None:
    """A damaged page in the question table and in each of its indexes (all chosen before
    any is written: a damaged page can stop the next dbstat read)."""
    with sqlite3.connect(path) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        names = [n for (n,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE tbl_name = 'question' "
            "AND type IN ('table', 'index')")]
        chosen = []
        for name in names:
            pages = [p for (p,) in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (name,))]
            if pages:
                chosen.append(min(pages, key=lambda p: abs(p - count / 2)))
    assert chosen, "the question table has no leaf page"
    with open(path, "r+b") as f:
        for page in chosen:
            f.seek((page - 1) * size)
            f.write(os.urandom(size))


def test_a_damaged_page_of_a_real_database_is_one_line_and_exit_4(deploy, generated):
    dep = deploy()
    path = _copy_of(generated, dep)
    healthy = dep.cli("doctor")
    assert "ok   database integrity: quick_check ok" in healthy.stdout, healthy.stdout
    # The question table and every index of it: whichever way SQLite's planner reads the
    # questions (status, export and enqueue all do), it meets a damaged page.
    damage_questions(path)
    # The first command in a real process (its exit and stderr as a shell sees them), the
    # others in this one (Deployment.cli_in_process): the same code, no start-up each.
    for i, command in enumerate((["status", "ex"], ["export", "ex"], ["enqueue", "ex"])):
        line = _assert_one_line((dep.cli if i == 0 else dep.cli_in_process)(*command), str(path))
        assert "database disk image is malformed" in line, (command, line)
    doctor = dep.cli("doctor")
    assert doctor.returncode == EXIT_DAMAGED, doctor.stdout + doctor.stderr
    assert "Traceback" not in doctor.stdout + doctor.stderr
    integrity = [ln for ln in doctor.stdout.splitlines() if "database integrity" in ln]
    assert len(integrity) == 1 and integrity[0].startswith("fail"), doctor.stdout
    # SQLite's own first line, or (when the damaged table page stops quick_check itself) the
    # same one line as the other commands.
    assert "quick_check failed: Page " in integrity[0] or \
        "database disk image is malformed" in integrity[0], integrity[0]
    # A backup of a damaged database would copy the damage: refused, nothing written.
    backup = dep.cli_in_process("backup", str(dep.workdir / "copy.db"))
    _assert_one_line(backup, str(path))
    assert not (dep.workdir / "copy.db").exists()


def test_a_file_that_is_not_a_database_is_one_line_and_exit_4(deploy):
    dep = deploy()
    dep.syllabus("ex", [("a", 5)])
    path = _db_path(dep)
    path.write_bytes(os.urandom(64 * 1024))
    for i, command in enumerate((["status", "ex"], ["enqueue", "ex"],
                                 ["backup", str(dep.workdir / "copy.db")])):
        line = _assert_one_line((dep.cli if i == 0 else dep.cli_in_process)(*command), str(path))
        assert "file is not a database" in line, (command, line)
    doctor = dep.cli("doctor")
    assert doctor.returncode == EXIT_DAMAGED and "Traceback" not in doctor.stdout + doctor.stderr
    assert "fail database integrity: " in doctor.stdout and "file is not a database" in \
        doctor.stdout, doctor.stdout
    # A worker started on it exits at once with the same line (as with a configuration
    # mistake), instead of starting and failing every task.
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "threads"],
        cwd=dep.workdir, env=dep.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_DAMAGED, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1].startswith("error: database "), output


def _damaged_views(pg_url: str, *tables: str) -> None:
    """PostgreSQL's own corruption error (SQLSTATE XX001 data_corrupted), raised by the
    server on every read of `tables`, as a damaged heap page raises it. (A real torn page
    needs the server's buffers cleared, which a shared server cannot be made to do.)"""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"ALTER TABLE {table} RENAME TO {table}_intact")
            conn.execute(f"""CREATE FUNCTION {table}_damaged() RETURNS SETOF {table}_intact
                LANGUAGE plpgsql AS $$ BEGIN
                RAISE EXCEPTION 'invalid page in block 7 of relation base/16384/16402'
                USING ERRCODE = 'data_corrupted'; END $$""")
            conn.execute(f"CREATE VIEW {table} AS SELECT * FROM {table}_damaged()")
            # Writes too: a statement that updates the table first (enqueue restarts
            # cancelled slices before it reads) meets the damaged page as a read would.
            conn.execute(f"""CREATE FUNCTION {table}_damaged_write() RETURNS trigger
                LANGUAGE plpgsql AS $$ BEGIN
                RAISE EXCEPTION 'invalid page in block 7 of relation base/16384/16402'
                USING ERRCODE = 'data_corrupted'; END $$""")
            conn.execute(f"CREATE TRIGGER {table}_damaged_write INSTEAD OF INSERT OR UPDATE "
                         f"OR DELETE ON {table} FOR EACH ROW "
                         f"EXECUTE FUNCTION {table}_damaged_write()")


def test_postgresql_data_corruption_is_one_line_and_exit_4(deploy):
    from examforge.syllabus import load_syllabus

    dep = deploy("postgres")
    syllabus = dep.syllabus("ex", [("a", 5), ("b", 5)])
    dep.store.sync_exam("ex", load_syllabus(syllabus, max_questions=100))  # schema and rows
    dep.store.engine.dispose()
    url = dep.env["DATABASE_URL"]
    _damaged_views(url, "slice", "question")
    shown = url  # as typed in DATABASE_URL: no driver name
    for i, command in enumerate((["status", "ex"], ["enqueue", "ex"], ["export", "ex"])):
        line = _assert_one_line((dep.cli if i == 0 else dep.cli_in_process)(*command), shown)
        assert "SQLSTATE XX001: invalid page in block 7" in line, line
    backup = dep.cli_in_process("backup", str(dep.workdir / "copy.db"))
    assert backup.returncode == 2 and "pg_dump" in backup.stderr, backup.stderr


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    wait_for(lambda: proc.poll() is not None, timeout_s, "the worker to exit", interval_s=0.2)
    return proc.returncode


def test_a_worker_on_a_damaged_database_logs_one_line_and_exits_4(deploy, generated):
    dep = deploy()
    path = _copy_of(generated, dep)
    # The reconcile pass a worker runs at start reads the unfinished slices through their
    # partial index (every slice of this exam is done, so no claim reads the table itself).
    damage_page(path, "ix_slice_active")
    proc = dep.worker(4)
    assert _wait_exit(proc, 60) == EXIT_DAMAGED, dep.worker_logs()
    log = dep.worker_logs(tail_chars=None)
    assert "Traceback" not in log, log[-4000:]
    critical = [ln for ln in log.splitlines() if " CRITICAL " in ln]
    assert len(critical) == 1, log[-4000:]
    assert f"database sqlite:///{path} is damaged (database disk image is malformed)" in \
        critical[0] and "this worker shuts down (exit 4)" in critical[0], critical[0]


def test_the_api_answers_a_damaged_database_with_a_problem_and_one_log_line(
        deploy, generated, caplog: pytest.LogCaptureFixture) -> None:
    from fastapi.testclient import TestClient

    from examforge.settings import Settings
    from producer.api import create_app

    dep = deploy()
    path = _copy_of(generated, dep)
    damage_questions(path)  # as above: whichever way the planner reads
    settings = Settings(_env_file=None, database_url=dep.env["DATABASE_URL"],
                        broker_url=dep.env["BROKER_URL"], exams_dir=dep.env["EXAMS_DIR"],
                        llm_base_url=dep.env["LLM_BASE_URL"])
    with TestClient(create_app(settings, local=True, no_auth=True),
                    raise_server_exceptions=False) as client:
        caplog.clear()
        for path_ in ("/exams/ex", "/exams/ex/questions"):
            response = client.get(path_)
            assert response.status_code == 503, response.text
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            assert body["title"] == "Database damaged", body
            assert f"database sqlite:///{path} is damaged" in body["detail"], body
    records = [r for r in caplog.records if r.name == "examforge.api"]
    assert len(records) == 2, [r.getMessage() for r in records]  # one line per request
    assert all(r.exc_info is None and "is damaged" in r.getMessage() for r in records)


# ---- backup and restore -------------------------------------------------------------------

QPC = 5


def _stored(path: Path, slug: str) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute(
            "SELECT chapter_id, count(*) FROM question WHERE exam = ? GROUP BY chapter_id",
            (slug,)).fetchall())


def test_a_backup_taken_mid_run_restores_and_enqueue_pays_only_for_the_rest(deploy, mock):
    """The documented way back (docs/how-to/backup-and-restore.md): `backup` while the workers write; later, stop the workers,
    put the copy in place of the file, run `enqueue` again. The second run pays for exactly
    the batches the copy did not hold, and every question is stored once."""
    # 1 s a call: the rest of the run (about 8 s on 3 threads) outlasts the backup command's
    # start on a loaded machine (at 0.25 s the run once ended before the copy was taken).
    mock.configure(latency_s=1.0)
    dep = deploy(questions_per_call=QPC)
    targets = {f"c{i}": 10 for i in range(16)}  # 32 calls of 5
    dep.syllabus("ex", list(targets.items()))
    path = _db_path(dep)
    dep.worker(3)
    assert dep.cli_in_process("enqueue", "ex").returncode == 0
    total = sum(targets.values())
    wait_for(lambda: total // 4 <= dep.status("ex")["questions"]["done"] <= total // 2, 60,
             "a quarter of the questions stored", interval_s=0.05)
    copy = dep.workdir / "backup" / "examforge.db"
    copy.parent.mkdir()
    backup = dep.cli_in_process("backup", str(copy))  # while the worker commits
    assert backup.returncode == 0 and "quick_check ok" in backup.stdout, backup.stderr
    held = _stored(copy, "ex")
    assert 0 < sum(held.values()) < total, held
    dep.wait_done("ex")
    assert sum(_stored(path, "ex").values()) == total  # the live database went on after it

    # Restore: stop the workers, replace the file (and drop its -wal and -shm), enqueue.
    for proc in list(dep.procs):
        dep.kill(proc, signal.SIGTERM)
    if dep._store is not None:
        dep._store.engine.dispose()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(copy, path)
    assert _stored(path, "ex") == held
    mock.reset()
    dep.worker(3)
    enqueue = dep.cli_in_process("enqueue", "ex")
    assert enqueue.returncode == 0, enqueue.stderr
    report = dep.wait_done("ex")
    assert report["chapters"]["done"] == len(targets), dump(report)
    needed = sum(math.ceil((t - held.get(c, 0)) / QPC) for c, t in targets.items())
    assert mock.stats()["calls_total"] == needed, (held, dump(mock.stats()))
    assert_stored_exactly_once(dep, "ex", targets)
