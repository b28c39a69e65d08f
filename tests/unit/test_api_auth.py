"""Bearer tokens: a missing or wrong one gets 401 and nothing else; serve refuses to run
open to the network."""

from __future__ import annotations

import subprocess
import sys

import pytest
from api_support import SYLLABUS, TOKEN, api

from producer.api.middleware import token_ok
from producer.api.serve import is_loopback


@pytest.mark.parametrize("header,ok", [
    (None, False), (b"", False), (b"Bearer", False), (b"Bearer ", False),
    (b"Basic dW5pdC10b2tlbg==", False), (b"Bearer unit-token", True),
    (b"bearer unit-token", True), (b"Bearer unit-token2", False), (b"Bearer unit-toke", False),
    (b"Bearer other", True), (b"Bearer  unit-token ", True)])
def test_token_check(header, ok):
    assert token_ok(header, [b"unit-token", b"other"]) is ok


def test_no_token_list_accepts_nothing():
    assert not token_ok(b"Bearer x", [])


@pytest.mark.parametrize("path,method", [
    ("/exams", "GET"), ("/exams/demo", "GET"), ("/exams/demo", "PUT"), ("/runs/1", "GET"),
    ("/exams/demo/runs", "POST"), ("/metrics", "GET"), ("/no/such/path", "GET"),
    ("/runs/1/events", "GET"), ("/exams/demo/export", "GET")])
def test_missing_or_wrong_token_gets_401_and_nothing_else(make_settings, path, method):
    with api(make_settings) as c:
        assert c.put("/exams/demo", json=SYLLABUS).status_code == 201
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"}):
            r = c.request(method, path, headers=headers, content=b'{"title": 1}')
            assert r.status_code == 401, (path, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json() == {"type": "about:blank", "title": "Unauthorized", "status": 401,
                                "detail": "a valid bearer token is required"}
            assert "demo" not in r.text


def test_the_right_token_passes_and_the_public_paths_need_none(make_settings):
    with api(make_settings) as c:
        assert c.get("/exams").status_code == 200
        for path in ("/", "/index.html", "/healthz", "/openapi.json"):
            assert c.get(path, headers={"Authorization": ""}).status_code == 200, path
        # The spec says which operations need the token, so that /docs can send one.
        spec = c.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert spec["paths"]["/healthz"]["get"]["security"] == []
        assert spec["paths"]["/exams"]["get"]["security"] == [{"bearer": []}]
        assert all(op["security"] == [{"bearer": []}]
                   for route, ops in spec["paths"].items() if route != "/healthz"
                   for op in ops.values()), "every operation but the probe needs the token"
        # A path that only looks like the page's files is not public.
        assert c.get("/../pyproject.toml", headers={"Authorization": ""}).status_code in (
            401, 404)


def test_no_auth_serves_without_a_token(make_settings):
    with api(make_settings, no_auth=True) as c:
        assert c.get("/exams", headers={"Authorization": ""}).status_code == 200


def test_the_token_is_never_logged(make_settings, caplog):
    caplog.set_level("DEBUG")
    with api(make_settings) as c:
        c.get("/exams")
        c.get("/exams", headers={"Authorization": "Bearer a-wrong-secret"})
    assert TOKEN not in caplog.text and "a-wrong-secret" not in caplog.text


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("::1", True),
                                           ("[::1]", True), ("localhost", True),
                                           ("127.0.0.2", True), ("0.0.0.0", False),
                                           ("192.168.1.5", False), ("example.com", False)])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


def _serve(tmp_path, *args, **env):
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("API_", "DATABASE_"))}
    return subprocess.run(
        [sys.executable, "-m", "producer", "serve", "--port", "1", *args], cwd=tmp_path,
        env={**clean, "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", **env},
        capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("args,env,message", [
    ((), {}, "error: API_TOKENS is not set and the database has no named token: add one "
             "(python -m producer token add NAME --role ROLE) or set API_TOKENS, or bind to "
             "a loopback address with --no-auth"),
    (("--host", "0.0.0.0", "--no-auth"), {},
     "error: --no-auth is only allowed on a loopback address (--host 127.0.0.1), not 0.0.0.0: "
     "set API_TOKENS instead"),
    (("--host", "0.0.0.0", "--no-auth"), {"API_TOKENS": "t"},
     "error: --no-auth is only allowed on a loopback address (--host 127.0.0.1), not 0.0.0.0: "
     "set API_TOKENS instead"),
    (("--host", "0.0.0.0"), {"API_TOKENS": " , "},
     "error: API_TOKENS is not set and the database has no named token: add one "
     "(python -m producer token add NAME --role ROLE) or set API_TOKENS, or bind to "
     "a loopback address with --no-auth")])
def test_serve_refuses_to_run_open(tmp_path, args, env, message):
    result = _serve(tmp_path, *args, **env)
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert not (tmp_path / "x.db").exists()  # refused before touching anything
