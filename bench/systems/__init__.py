"""The systems under test, one module each. Every `run_*` function does one workload once
against the shared mock and returns a `bench.measure.Result`:

- `baseline`: one asyncio + httpx process with a semaphore ("the seed script done right");
- `embedded`: `python -m producer run` (threads in one process, SQLite);
- `distributed`: Celery workers + `python -m producer enqueue`, SQLite or PostgreSQL;
- `minimal`: a minimal Celery task (a completion-row check, one httpx call, one SQLite insert);
- `curator`: the peer, bespokelabs-curator, in its own venv.
"""
