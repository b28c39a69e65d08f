"""Named tokens across real processes: `token add` and `token revoke` from the command line,
two `serve --local` replicas on one PostgreSQL database (no API_TOKENS): each token does
what its role allows on both, a revocation holds on both at the next request (no cache to
wait out), and neither replica's log ever holds a token."""

from __future__ import annotations

import getpass

import httpx
import pytest
from apiserver import ApiServer, put_syllabus

pytestmark = pytest.mark.e2e


def _add(dep, name: str, *args: str) -> str:
    result = dep.cli_in_process("token", "add", name, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.rstrip("\n").splitlines()[-1]


def _as(server: ApiServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30,
                        headers={"Authorization": f"Bearer {token}"})


def test_roles_and_a_revocation_hold_on_every_replica(deploy):
    dep = deploy("postgres")
    admin = _add(dep, "root", "--role", "admin")
    reviewer = _add(dep, "teacher", "--role", "reviewer", "--exam", "demo")
    replicas = [ApiServer.start(dep, "--local", API_TOKENS=""),
                ApiServer.start(dep, "--local", API_TOKENS="")]
    with _as(replicas[0], admin) as root:
        put_syllabus(root, "demo", [("a", 2)])
        put_syllabus(root, "other", [("a", 2)])
    for server in replicas:
        with _as(server, reviewer) as c:
            assert c.get("/me").json() == {"name": "teacher", "role": "reviewer",
                                           "exams": ["demo"]}
            assert [e["exam"] for e in c.get("/exams").json()["items"]] == ["demo"]
            assert c.get("/exams/other").status_code == 404
            r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}, json={})
            assert r.status_code == 403 and r.json()["required_role"] == "operator"
    assert dep.cli_in_process("token", "revoke", "teacher").returncode == 0
    for server in replicas:  # at once, on both: each request reads the database
        with _as(server, reviewer) as c:
            assert c.get("/me").status_code == 401
    with _as(replicas[1], admin) as root:
        rows = root.get("/audit").json()["items"]
    user = f"cli:{getpass.getuser()}"
    assert [(r["actor"], r["action"], r["details"].get("name")) for r in rows
            if r["action"].startswith("token.")] == [
        (user, "token.revoke", "teacher"), (user, "token.add", "teacher"),
        (user, "token.add", "root")]
    assert [(r["actor"], r["action"], r["exam"]) for r in rows
            if r["action"] == "syllabus.put"] == [("root", "syllabus.put", "other"),
                                                  ("root", "syllabus.put", "demo")]
    listed = dep.cli_in_process("token", "list", "--revoked")
    for server in replicas:
        for token in (admin, reviewer):
            assert token[3:] not in server.log() and token[3:] not in listed.stdout
