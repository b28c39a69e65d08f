"""The minimal Celery task: the baseline issue 8's first row compares examforge's worker with.

Per chapter it does what any Celery job that calls a model must do, and nothing more: a
completion-row check in SQLite, one httpx call to the provider (the same body and prompt as
examforge/llm.py, so the mock counts it per chapter), the reply validated with
examforge.output.parse_questions, and one SQLite insert of the completion row. No lease, no
ledger row before the call, no fence, no budget, no rate limit. Its Celery settings are
examforge's where they change per-task cost: late ack, prefetch 1 (WORKER_PREFETCH_MULTIPLIER),
JSON, no result backend, no task events. Writers share one in-process lock, so threads never
spin in SQLite's busy handler (the same as examforge's store); WAL and synchronous=NORMAL too.

Run by the bench as `celery -A bench.systems.minimal worker -P threads -c N -Q QUEUE`, with
BROKER_URL, TASK_QUEUE, LLM_BASE_URL, QUESTIONS_PER_CALL and MINIMAL_DB in the environment;
`python -m bench.systems.minimal enqueue SLUG T1,T2,...` publishes one task per chapter (a
plain loop of apply_async). One call per chapter: targets above QUESTIONS_PER_CALL are refused.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from typing import Any

from celery import Celery

PROBE_SQL = {
    "done_sql": "SELECT count(*) FROM completion WHERE exam = %s",
    "questions_sql": "SELECT coalesce(sum(questions), 0) FROM completion WHERE exam = %s",
    "failed_sql": "SELECT count(*) FROM completion WHERE exam = %s AND questions < 0",
}
_SCHEMA = ("CREATE TABLE IF NOT EXISTS completion (exam TEXT NOT NULL, chapter_id TEXT NOT NULL,"
           " questions INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (exam, chapter_id))")


def make_app(broker_url: str, queue: str, prefetch: int = 1) -> Celery:
    app = Celery("minimal", broker=broker_url)
    app.conf.update(
        task_default_queue=queue, task_acks_late=True, worker_prefetch_multiplier=prefetch,
        task_ignore_result=True, task_serializer="json", accept_content=["json"],
        worker_send_task_events=False, task_send_sent_event=False, task_track_started=False,
        worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
    return app


app = make_app(os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/12"),
               os.environ.get("TASK_QUEUE", "minimal"),
               int(os.environ.get("WORKER_PREFETCH_MULTIPLIER", "1")))

_local = threading.local()
# Re-entrant: `chapter`'s failure handler holds it while `_db` may still have to open the
# thread's connection, which takes it too (a plain Lock deadlocked the worker there).
_write_lock = threading.RLock()
_client_lock = threading.Lock()
_client: Any = None


def _db() -> sqlite3.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(os.environ["MINIMAL_DB"], timeout=60, check_same_thread=False)
        with _write_lock:  # 32 threads opening at once: switching to WAL one at a time
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            conn.commit()
        _local.conn = conn
    return conn


def _http() -> Any:
    global _client
    with _client_lock:
        if _client is None:
            import httpx

            _client = httpx.Client(
                base_url=os.environ["LLM_BASE_URL"].rstrip("/") + "/",
                timeout=httpx.Timeout(60.0, connect=5.0),
                headers={"Authorization": "Bearer sk-mock"},
                limits=httpx.Limits(max_connections=512, max_keepalive_connections=512))
        return _client


def _post(body: dict[str, Any], attempts: int = 3) -> Any:
    """The call, retried on what any client must retry (a dropped keep-alive connection, a
    429 or 5xx); anything else raises at once."""
    import httpx

    for attempt in range(attempts):
        try:
            response = _http().post("chat/completions", json=body)
        except httpx.TransportError:
            if attempt == attempts - 1:
                raise
            continue
        if response.status_code == 429 or response.status_code >= 500:
            if attempt < attempts - 1:
                continue
        response.raise_for_status()
        return response
    raise AssertionError("unreachable")


@app.task(name="minimal.chapter", acks_late=True)
def chapter(exam: str, chapter_id: str, title: str, target: int) -> str:
    try:
        return _chapter(exam, chapter_id, title, target)
    except Exception as exc:
        # Booked as failed (questions -1, PROBE_SQL's failed_sql), so the bench sees the
        # chapter finished and reports the failure instead of waiting for it forever.
        with _write_lock:
            _db().execute("INSERT OR IGNORE INTO completion VALUES (?, ?, -1, ?)",
                          (exam, chapter_id, repr(exc)[:500]))
            _db().commit()
        raise


def _chapter(exam: str, chapter_id: str, title: str, target: int) -> str:
    from examforge.output import parse_questions
    from examforge.prompt import build_messages
    from examforge.syllabus import Chapter

    db = _db()
    if db.execute("SELECT 1 FROM completion WHERE exam = ? AND chapter_id = ?",
                  (exam, chapter_id)).fetchone():
        return "already done"
    spec = Chapter(id=chapter_id, title=title, questions=target)
    body = {"model": "mock-model",
            "messages": build_messages(exam, f"Benchmark exam {exam}", spec, target, []),
            "temperature": 0.7, "response_format": {"type": "json_object"}}
    response = _post(body)
    choice = response.json()["choices"][0]
    parsed = parse_questions(choice["message"].get("content"), choice.get("finish_reason"),
                             target, set())
    with _write_lock:
        db.execute("INSERT OR IGNORE INTO completion VALUES (?, ?, ?, ?)",
                   (exam, chapter_id, len(parsed.questions), choice["message"]["content"]))
        db.commit()
    return "done"


def enqueue_main(argv: list[str]) -> int:
    """`enqueue SLUG T1,T2,...`: one message per chapter, a plain apply_async loop."""
    from bench.measure import chapter_id

    slug, targets = argv[0], [int(t) for t in argv[1].split(",")]
    qpc = int(os.environ.get("QUESTIONS_PER_CALL", "5"))
    if max(targets) > qpc:
        print(f"the minimal task makes one call per chapter: targets must be <= {qpc}",
              file=sys.stderr)
        return 2
    sqlite3.connect(os.environ["MINIMAL_DB"]).execute(_SCHEMA).connection.close()
    for i, target in enumerate(targets):
        chapter.apply_async((slug, chapter_id(i), f"Topic number {i}", target))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["enqueue"]:
        raise SystemExit(enqueue_main(sys.argv[2:]))
    raise SystemExit("usage: python -m bench.systems.minimal enqueue SLUG T1,T2,...")
