"""`token add/list/revoke` and `audit` in this process (producer.cli.main) on SQLite, with
the API on the same database: a token is printed once and is then nowhere in clear (the
database file, the logs, any output or response), and each recorded action leaves its audit
row, through the CLI (as cli:<user>) and through the API (as the token's name)."""

from __future__ import annotations

import getpass
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from api_support import SYLLABUS, api, wait_run
from helpers import write_syllabus
from test_cli_first_run import assert_one_line, cli, env  # noqa: F401 (the fixture)
from test_cli_regenerate import published  # noqa: F401 (the fixture)

ME = f"cli:{getpass.getuser()}"


def _add(capsys: Any, name: str, *args: str) -> str:
    code, out, err = cli(capsys, "token", "add", name, *args)
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert lines[-1].startswith("ef_") and " " not in lines[-1], out
    assert lines[-1] not in "\n".join(lines[:-1]) + err  # once, alone on the last line
    return lines[-1]


def _audit(capsys: Any, *args: str) -> list[dict[str, Any]]:
    code, out, err = cli(capsys, "audit", "--json", *args)
    assert code == 0, err
    return list(json.loads(out)["items"])


def _database_bytes(env: dict[str, str]) -> bytes:  # noqa: F811
    """The database file and its WAL: where a token written in clear would be."""
    path = Path(env["DATABASE_URL"].removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_a_token_is_shown_once_and_then_nowhere(env, capsys, caplog, make_settings):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []  # every output and response
    secret = _add(capsys, "alice", "--role", "reviewer", "--exam", "demo")
    other = _add(capsys, "ops", "--role", "operator")
    for args in (("token", "list"), ("token", "list", "--json"), ("audit",),
                 ("audit", "--json")):
        code, out, err = cli(capsys, *args)
        assert code == 0, err
        seen += [out, err]
    listed = json.loads(cli(capsys, "token", "list", "--json")[1])["items"]
    assert [(t["name"], t["role"], t["exams"], t["last_used_at"]) for t in listed] == [
        ("alice", "reviewer", ["demo"], None), ("ops", "operator", None, None)]
    with api(make_settings, database_url=env["DATABASE_URL"], api_tokens="") as c:
        for token in (secret, other):
            auth = {"Authorization": f"Bearer {token}"}
            for r in (c.get("/me", headers=auth), c.get("/exams", headers=auth),
                      c.put("/exams/demo", json=SYLLABUS, headers=auth),
                      c.get("/audit", headers=auth), c.get("/openapi.json"),
                      c.get("/exams/nosuch", headers=auth)):
                assert r.status_code < 500, r.text
                seen += [r.text, json.dumps(dict(r.headers))]
        assert c.get("/me", headers={"Authorization": f"Bearer {secret}"}).json() == {
            "name": "alice", "role": "reviewer", "exams": ["demo"]}
        assert cli(capsys, "token", "revoke", "alice")[0] == 0
        r = c.get("/me", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 401
        seen.append(r.text)
    used = json.loads(cli(capsys, "token", "list", "--json", "--revoked")[1])["items"]
    assert {t["name"]: bool(t["last_used_at"]) for t in used} == {"alice": True, "ops": True}
    assert [t["name"] for t in used if t["revoked_at"]] == ["alice"]
    stored = _database_bytes(env)
    assert stored, "no database file found"
    for token in (secret, other):
        # Not even a part of it: any 12 characters of its random part (72 bits).
        for part in {token[i:i + 12] for i in range(3, len(token) - 11)}:
            assert part.encode() not in stored, part
            assert not any(part in text for text in seen), part
            assert part not in caplog.text, part
    from producer.access import token_hash
    assert token_hash(secret).encode() in stored  # what is kept instead


def test_token_mistakes_are_one_line(env, capsys):  # noqa: F811
    _add(capsys, "alice", "--role", "reader")
    for args, needle in (
            (("add", "alice", "--role", "reader"), "revoke it first"),
            (("add", "root", "--role", "admin", "--exam", "x"), "covers every exam"),
            (("add", "no spaces", "--role", "reader"), "letters, digits"),
            (("add", "0123456789abcdef0123456789abcdef", "--role", "reader"), "API_TOKENS"),
            (("add", "x", "--role", "reader", "--exam", "Bad_Slug"), "--exam"),
            (("add", "x", "--role", "boss"), "'boss' is not one of"),
            (("revoke", "nobody"), "no live token")):
        assert_one_line(*cli(capsys, "token", *args)[::2], needle)
    assert_one_line(*cli(capsys, "audit", "--since", "yesterday")[::2], "ISO 8601")
    assert_one_line(*cli(capsys, "audit", "--after", "zz")[::2], "cursor")


def test_the_cli_records_its_actions_as_the_local_user(env, capsys, published,  # noqa: F811
                                                       monkeypatch):
    import runner.local

    write_syllabus(Path(env["EXAMS_DIR"]), "ex", [("a", 3), ("b", 2)])
    monkeypatch.setattr(runner.local, "run_local", lambda *a, **k: {})
    cli(capsys, "run", "ex", "--budget-usd", "2")
    assert cli(capsys, "enqueue", "ex", "--budget-usd", "3")[0] == 0
    assert cli(capsys, "cancel", "ex", "--chapter", "b")[0] == 0
    assert cli(capsys, "cancel", "ex", "--chapter", "zz")[0] == 2
    assert cli(capsys, "resume", "ex")[0] == 0
    assert cli(capsys, "retry", "ex")[0] == 0
    _add(capsys, "alice", "--role", "reader")
    assert cli(capsys, "token", "revoke", "alice")[0] == 0
    rows = _audit(capsys)
    assert {r["actor"] for r in rows} == {ME}
    got = [(r["action"], r["exam"], r["outcome"]) for r in reversed(rows)]
    assert got == [
        ("run.start", "ex", "ok"), ("budget.set", "ex", "ok"),
        ("run.start", "ex", "ok"), ("budget.set", "ex", "ok"),
        ("run.cancel", "ex", "ok"), ("run.cancel", "ex", "refused"),
        ("run.resume", "ex", "ok"), ("run.retry", "ex", "ok"),
        ("token.add", None, "ok"), ("token.revoke", None, "ok")]
    by = list(reversed(rows))
    assert by[0]["details"] == {"command": "run", "budget_usd": 2.0, "batch": False}
    assert by[3]["details"] == {"budget_usd": 3.0}
    assert by[4]["details"] == {"chapters": ["b"], "cancelled": 1}
    assert "UserError" in by[5]["details"]["error"]
    assert by[8]["details"] == {"name": "alice", "role": "reader"}
    # Keyset pages: every row once, newest first, and --exam and --since filter.
    code, out, _ = cli(capsys, "audit", "--json", "--limit", "3")
    first = json.loads(out)
    later = _audit(capsys, "--after", first["next"], "--limit", "100")
    assert [r["id"] for r in first["items"] + later] == [r["id"] for r in rows]
    assert len(_audit(capsys, "--exam", "ex")) == 8
    assert len(_audit(capsys, "--since", "1h")) == len(rows)
    assert _audit(capsys, "--since", "2999-01-01T00:00:00Z") == []
    code, out, _ = cli(capsys, "audit", "--exam", "ex")
    assert code == 0 and "run.cancel" in out and ME in out


def test_the_api_records_its_actions_as_the_tokens_name(make_settings, mock_llm):
    from producer.access import new_token, token_hash

    with api(make_settings, mock_llm) as c:
        store = c.app.state.ctx.store
        secret = new_token()
        store.add_token("ops", "operator", ["demo"], token_hash(secret), "test")
        auth = {"Authorization": f"Bearer {secret}"}
        assert c.put("/exams/demo", json=SYLLABUS, headers=auth).status_code == 201
        assert c.put("/exams/demo", json={"title": ""}, headers=auth).status_code == 422
        assert c.put("/exams/demo/sources/n.md", content=b"# N\n\nText.\n",
                     headers=auth).status_code == 201
        assert c.delete("/exams/demo/sources/n.md", headers=auth).status_code == 204
        assert c.delete("/exams/demo/sources/n.md", headers=auth).status_code == 404
        run = c.post("/exams/demo/runs", json={"budget_usd": 5},
                     headers={**auth, "Idempotency-Key": "a"}).json()
        wait_run(c, run["id"])
        assert c.post(f"/runs/{run['id']}/cancel", headers=auth).status_code == 409
        assert c.get("/audit", headers=auth).status_code == 403
        page = c.get("/audit").json()  # the admin of API_TOKENS
    rows = list(reversed(page["items"]))
    assert {r["actor"] for r in rows} == {"ops"}
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("syllabus.put", "ok"), ("syllabus.put", "refused"), ("source.put", "ok"),
        ("source.delete", "ok"), ("source.delete", "refused"), ("run.start", "ok"),
        ("budget.set", "ok"), ("run.cancel", "refused")]
    assert {r["exam"] for r in rows} == {"demo"}
    assert rows[5]["details"]["run"] == run["id"] and rows[5]["details"]["budget_usd"] == 5
    assert rows[4]["details"]["status"] == 404
    assert "Conflict" in rows[7]["details"]["error"]
    assert rows[0]["at"].endswith("+00:00")


@pytest.mark.parametrize("since", ["30m", "2026-12-01T09:00Z", "2026-12-01T09:00:00",
                                   "2026-12-01T09:00:00+01:00"])
def test_since_reads_a_duration_or_an_iso_time(since):
    from producer.audit import since_epoch_s

    class Clock:
        def database_now(self) -> float:
            return 10_000.0

    at = since_epoch_s(since, Clock())
    assert at == {"30m": 8_200.0, "2026-12-01T09:00Z": 1796115600.0,
                  "2026-12-01T09:00:00": 1796115600.0,
                  "2026-12-01T09:00:00+01:00": 1796112000.0}[since]
