"""CSV with a UTF-8 byte-order mark (issue 31): `export --format csv --bom` on both paths
(the SQLite fast path and the store's) and the API's `bom=true` give the plain CSV's bytes
after the mark, which csv reads back with its Persian text exact; a mark asked of another
format is refused in one line (CLI) or a 422 naming the field (API)."""

from __future__ import annotations

import csv
import io
import sqlite3

import pytest
from api_support import api, wait_run
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)

from bench.seed import seed_exam
from producer import export_sqlite
from producer.export import export, render
from storage import open_existing_store

BOM = b"\xef\xbb\xbf"
PERSIAN = "کدام پورت پیش‌فرض HTTPS است؟ ۴۴۳"


@pytest.fixture()
def seeded(tmp_path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'ef.db'}"
    seed_exam(url, "ex", 6, 2)
    conn = sqlite3.connect(tmp_path / "ef.db")
    with conn:
        conn.execute("UPDATE question SET question = ? WHERE number = 1", (PERSIAN,))
    conn.close()
    return url


def _read(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"), newline="")))


def test_both_paths_write_the_mark_then_the_plain_csv(seeded, tmp_path):
    store = open_existing_store(seeded)
    plain = render(store.iter_questions("ex"), "csv").encode()
    slow = tmp_path / "slow.csv"
    assert export(store.iter_questions("ex"), "csv", str(slow), bom=True) == 6
    store.engine.dispose()
    fast = tmp_path / "fast.csv"
    assert export_sqlite.export(seeded, tmp_path, "ex", "csv", str(fast), bom=True) == 6
    assert slow.read_bytes() == fast.read_bytes() == BOM + plain
    assert PERSIAN in [r["question"] for r in _read(fast.read_bytes())]
    # Without the flag, no mark: the default export is unchanged.
    assert export_sqlite.export(seeded, tmp_path, "ex", "csv", str(fast)) == 6
    assert fast.read_bytes() == plain


def test_a_mark_for_another_format_is_refused_in_one_line(env, capsys, tmp_path):  # noqa: F811
    code, _, stderr = cli(capsys, "export", "ex", "--format", "jsonl", "--bom",
                          "-o", str(tmp_path / "x.jsonl"))
    assert_one_line(code, stderr, "--bom", "csv", exit_code=code or 1)
    assert code != 0 and not (tmp_path / "x.jsonl").exists()


def test_the_api_s_bom_option(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json={"title": "T", "language": "fa", "chapters": [
            {"id": "a", "title": "فصل", "questions": 3}]})
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        plain = c.get("/exams/demo/export", params={"format": "csv"}).content
        marked = c.get("/exams/demo/export", params={"format": "csv", "bom": "true"}).content
        assert marked == BOM + plain and not plain.startswith(BOM)
        r = c.get("/exams/demo/export", params={"format": "gift", "bom": "true"})
        assert r.status_code == 422 and r.json()["detail"].startswith("query.bom")
