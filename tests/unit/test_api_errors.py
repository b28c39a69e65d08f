"""Every error is an RFC 9457 problem document; bad input is never a 500; a body over 1 MB
is 413, whether Content-Length announces it or a chunked body reaches it."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from api_support import SYLLABUS, api

from examforge.errors import SyllabusError
from examforge.syllabus import load_syllabus
from producer.api.middleware import MAX_BODY_BYTES, BodyLimit


def _problem(r, status):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["type"] == "about:blank"
    assert body["title"] and body["detail"]
    return body


def test_content_length_over_1_mb_is_413(make_settings):
    with api(make_settings) as c:
        big = b"{" + b" " * MAX_BODY_BYTES + b"}"
        body = _problem(c.put("/exams/demo", content=big), 413)
        assert body["detail"] == "request body over 1000000 bytes"
        _problem(c.post("/exams/demo/runs", content=big, headers={"Idempotency-Key": "k"}), 413)
        assert c.get("/exams").json() == {"items": [], "next": None}
        # Exactly the limit is allowed through (and is then judged as a syllabus).
        exact = b'"' + b"x" * (MAX_BODY_BYTES - 2) + b'"'
        assert c.put("/exams/demo", content=exact).status_code == 422


def _drive(app, chunks, headers=()):
    """Run the middleware on a hand-made ASGI request whose body comes in `chunks`."""
    sent, seen = [], []
    messages = [{"type": "http.request", "body": ch, "more_body": i < len(chunks) - 1}
                for i, ch in enumerate(chunks)]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def inner(scope, receive, send):
        message = await receive()
        seen.append(message)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    scope = {"type": "http", "method": "PUT", "path": "/x", "headers": list(headers)}
    asyncio.run(BodyLimit(inner, limit=100)(scope, receive, send))
    return sent, seen


def test_a_chunked_body_is_cut_at_the_limit_and_the_app_never_sees_it():
    sent, seen = _drive(None, [b"x" * 60, b"x" * 60])
    assert sent[0]["status"] == 413 and seen == []
    assert json.loads(sent[1]["body"])["status"] == 413
    sent, seen = _drive(None, [b"x" * 50, b"x" * 50])
    assert sent[0]["status"] == 200 and seen[0]["body"] == b"x" * 100
    sent, _ = _drive(None, [b"x"], headers=[(b"content-length", b"abc")])
    assert sent[0]["status"] == 400


@pytest.mark.parametrize("raw", [
    b"", b"{", b"[]", b"null", b'"text"', b"\xff\xfe", b'{"title": "T", "chapters": []}',
    b'{"title": "T", "title": "U", "chapters": [{"id": "a", "title": "A", "questions": 1}]}',
    b'{"title": "T", "chapters": [{"id": "a", "title": "A", "questions": NaN}]}',
    b'{"title": "T", "chapters": [{"id": "A!", "title": "A", "questions": 1}]}',
    b'{"title": "T", "chapters": [{"id": "a", "title": "A", "questions": "5"}]}',
    b'{"title": "T\\n", "chapters": [{"id": "a", "title": "A", "questions": 5}]}',
    b'{"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 0}]}',
    b'{"title": "T", "chapters": [{"id": "a", "title": "A", "questions": 1, "x": 1}]}',
    b"[" * 50 + b"]" * 50])
def test_a_bad_syllabus_gets_the_file_s_own_message(make_settings, tmp_path, raw):
    path = tmp_path / "syllabus.json"
    path.write_bytes(raw)
    with pytest.raises(SyllabusError) as from_file:
        load_syllabus(path, max_questions=5000)
    with api(make_settings) as c:
        body = _problem(c.put("/exams/demo", content=raw,
                              headers={"Content-Type": "application/json"}), 422)
    # The same text, the file's path replaced by "request body".
    assert body["detail"] == str(from_file.value).replace(str(path), "request body")
    assert "\n" not in body["detail"]


@pytest.mark.parametrize("raw", [
    b"{", b"[]", b'{"budget_usd": -1}', b'{"budget_usd": 0}', b'{"budget_usd": "5"}',
    b'{"budget_usd": NaN}', b'{"budget_usd": Infinity}', b'{"other": 1}', b'"x"',
    b'{"budget_usd": 1e999}'])
def test_a_bad_run_body_is_a_422_problem(make_settings, mock_llm, raw):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        body = _problem(c.post("/exams/demo/runs", content=raw, headers={
            "Idempotency-Key": "k", "Content-Type": "application/json"}), 422)
        assert body["errors"]
        assert c.get("/exams/demo").json()["state"] == "new"  # nothing started


def test_not_found_method_and_validation_errors_are_problems(make_settings):
    with api(make_settings) as c:
        _problem(c.get("/exams/nope"), 404)
        _problem(c.get("/runs/99"), 404)
        _problem(c.get("/runs/0"), 422)
        _problem(c.get("/runs/abc"), 422)
        _problem(c.get("/exams/Bad_Slug"), 422)
        _problem(c.get("/nothing/here"), 404)
        _problem(c.delete("/exams/demo"), 405)
        _problem(c.get("/exams/demo/questions", params={"limit": 0}), 422)
        _problem(c.get("/exams/demo/export", params={"format": "xml"}), 422)
        _problem(c.post("/exams/nope/runs", headers={"Idempotency-Key": "k"}), 404)
        _problem(c.post("/runs/5/cancel"), 404)


def test_random_bytes_never_make_a_500(make_settings, mock_llm):
    rng = random.Random(11)
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        for i in range(150):
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
            if i % 3 == 0:  # mostly-JSON noise
                raw = json.dumps({"title": rng.choice(["T", 5, None]), "chapters": [
                    {"id": rng.choice(["a", "B", 1]), "title": "A",
                     "questions": rng.choice([1, -1, 10**9, 2.5, "x"])}]}).encode()
            for r in (c.put(f"/exams/x{i}", content=raw),
                      c.post("/exams/demo/runs", content=raw,
                             headers={"Idempotency-Key": f"k{i}",
                                      "Content-Type": "application/json"})):
                assert r.status_code < 500, (raw, r.text)


def test_405_lists_every_method_of_the_path(make_settings):
    with api(make_settings) as c:
        for method, path, allow in (("OPTIONS", "/exams/demo", "GET, HEAD, PUT"),
                                    ("DELETE", "/exams/demo/runs", "GET, HEAD, POST"),
                                    ("GET", "/runs/1/cancel", "POST"),
                                    ("POST", "/index.html", "GET, HEAD")):
            r = c.request(method, path)
            _problem(r, 405)
            assert r.headers["allow"] == allow, (method, path)
