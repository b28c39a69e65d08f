"""GET /exams/SLUG/export in the bank formats of `producer export --format`, the levels on
GET /exams/SLUG/questions, and HEAD where GET is, on the in-process app. Each bank is read
back with the strict readers of the writers' own tests and compared with the database."""

from __future__ import annotations

import pytest
from api_support import AUTH, api, wait_run
from helpers import wait_for
from test_banks_anki import read_collection
from test_banks_gift import read_bank as read_gift
from test_banks_moodle_xml import read_bank as read_moodle_xml
from test_banks_qti import read_bank as read_qti

SYLLABUS = {"title": "Levels", "chapters": [
    {"id": "a", "title": "Chapter A", "questions": 6, "difficulty": "hard", "bloom": "apply"},
    {"id": "b", "title": "Chapter B", "questions": 4}]}


@pytest.fixture
def client(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        yield c


def _names(read):
    return [got.get("name") or got.get("title") for _, got in read]


@pytest.mark.parametrize("fmt,media_type,filename", [
    ("moodle-xml", "application/xml", "demo.xml"),
    ("gift", "text/plain; charset=utf-8", "demo.gift.txt"),
    ("anki", "application/octet-stream", "demo.apkg"),
    ("qti", "application/zip", "demo.qti.zip")])
def test_bank_exports_hold_every_stored_question(client, tmp_path, fmt, media_type, filename):
    r = client.get("/exams/demo/export", params={"format": fmt})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == media_type
    assert r.headers["content-disposition"] == f'attachment; filename="{filename}"'
    assert int(r.headers["content-length"]) == len(r.content)
    rows = list(client.app.state.ctx.store.iter_questions("demo"))
    names = [f"{q['chapter_id']}-{q['number']:04d}" for q in rows]
    if fmt == "moodle-xml":
        read = read_moodle_xml(r.content)
        assert _names(read) == names
        assert [got["answer_index"] for _, got in read] == [q["answer_index"] for q in rows]
    elif fmt == "gift":
        assert _names(read_gift(r.content)) == names
    elif fmt == "qti":
        _, read = read_qti(r.content)
        assert _names(read) == names
    else:
        notes = read_collection(r.content, tmp_path).notes
        assert len(notes) == len(rows)
        tags = sorted(tuple(sorted(t.split())) for _, _, _, t, _ in notes)
        assert tags == sorted([("bloom:apply", "difficulty:hard")] * 6 + [()] * 4)


def test_questions_carry_their_difficulty_and_bloom_level(client):
    items = client.get("/exams/demo/questions", params={"limit": 100}).json()["items"]
    assert len(items) == 10
    levels = {(q["chapter_id"], q["difficulty"], q["bloom"]) for q in items}
    assert levels == {("a", "hard", "apply"), ("b", None, None)}
    spec = client.get("/openapi.json").json()["components"]["schemas"]["Question"]
    assert {"difficulty", "bloom"} <= set(spec["properties"]) and \
        {"difficulty", "bloom"} <= set(spec["required"])
    formats = spec_formats(client)
    assert formats == ["jsonl", "json", "csv", "moodle-xml", "gift", "anki", "qti"]


def spec_formats(client):
    op = client.get("/openapi.json").json()["paths"]["/exams/{slug}/export"]["get"]
    [param] = [p for p in op["parameters"] if p["name"] == "format"]
    return param["schema"]["pattern"].strip("^$()").split("|")


def test_an_unknown_format_is_422_naming_the_field(client):
    r = client.get("/exams/demo/export", params={"format": "docx"})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["detail"].startswith("query.format")


def test_head_answers_where_get_does_with_its_headers_and_no_body(client):
    for path, params in (("/healthz", {}), ("/exams", {}), ("/exams/demo", {}),
                         ("/exams/demo/runs", {}), ("/runs/1", {}), ("/metrics", {}),
                         ("/exams/demo/questions", {"limit": 2}),
                         ("/exams/demo/export", {"format": "csv"}),
                         ("/exams/demo/export", {"format": "anki"})):
        get = client.get(path, params=params)
        head = client.head(path, params=params)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"], path
        if "content-disposition" in get.headers:
            assert head.headers["content-disposition"] == get.headers["content-disposition"]
    assert client.head("/exams/nope").status_code == 404
    r = client.head("/runs/1/events")  # an endless body: no HEAD there
    assert r.status_code == 405 and r.headers["allow"] == "GET"


def test_an_export_that_fails_midway_is_broken_off_not_ended_as_whole(make_settings, mock_llm):
    """A streamed export whose writer fails after its first chunks (the database went away)
    must not end like a complete download: the response is broken off, which a client
    reports as an incomplete body."""
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        store = c.app.state.ctx.store
        real = store.iter_questions

        def failing(slug):
            for i, row in enumerate(real(slug)):
                if i == 3:
                    raise OSError("the database went away")
                yield {**row, "explanation": row["explanation"] + " " + "x" * 30000}

        store.iter_questions = failing
        # A real server (TestClient hands back whatever body was sent): uvicorn, in a thread.
        import socket
        import threading

        import httpx
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(c.app, host="127.0.0.1", port=port,
                                               lifespan="off", log_level="critical"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started, 10, "uvicorn to start")
            with pytest.raises(httpx.RemoteProtocolError):
                with httpx.stream("GET", f"http://127.0.0.1:{port}/exams/demo/export",
                                  params={"format": "jsonl"}, headers=AUTH, timeout=10) as r:
                    assert r.status_code == 200
                    b"".join(r.iter_bytes())
        finally:
            server.should_exit = True
            thread.join(10)
