"""Exams through the API: stored syllabi (seen by the CLI too), status, questions by keyset
pages, streamed exports, metrics and the OpenAPI document."""

from __future__ import annotations

import json

from api_support import SYLLABUS, api, wait_run
from helpers import write_syllabus

from producer.export import render


def _run_to_end(c, slug="demo", key="k"):
    run = c.post(f"/exams/{slug}/runs", headers={"Idempotency-Key": key}).json()
    return wait_run(c, run["id"])


def test_put_creates_then_replaces_and_refuses_a_file_based_exam(make_settings, tmp_path):
    with api(make_settings) as c:
        r = c.put("/exams/demo", json=SYLLABUS)
        assert r.status_code == 201 and r.headers["location"] == "/exams/demo"
        assert r.json() == {"exam": "demo", "title": "Demo", "chapters": 2, "questions": 10}
        assert c.put("/exams/demo", json={**SYLLABUS, "title": "Demo 2"}).status_code == 200
        assert c.get("/exams/demo").json()["title"] == "Demo 2"
        write_syllabus(tmp_path / "exams", "filed", [("a", 3)])
        r = c.put("/exams/filed", json=SYLLABUS)
        assert r.status_code == 409 and "EXAMS_DIR" in r.json()["detail"]
        listed = {e["exam"]: e for e in c.get("/exams").json()["items"]}
        assert listed["demo"]["state"] == "new" and listed["demo"]["source"] == "api"
        assert listed["demo"]["questions"] == {"done": 0, "target": 10}
        assert c.get("/exams/filed").json()["state"] == "new"  # a file is an exam too
        # ... listed too, never run (the page can start it); a file that does not load is not.
        assert listed["filed"]["state"] == "new" and listed["filed"]["source"] == "file"
        assert listed["filed"]["questions"] == {"done": 0, "target": 3}
        (tmp_path / "exams" / "broken").mkdir()
        (tmp_path / "exams" / "broken" / "syllabus.json").write_text("{")
        assert "broken" not in {e["exam"] for e in c.get("/exams").json()["items"]}


def test_the_cli_finds_a_syllabus_the_api_stored(make_settings, tmp_path, monkeypatch):
    from producer.syllabi import resolve
    from storage import open_store

    settings = make_settings()
    with api(make_settings) as c:
        c.put("/exams/demo", json=SYLLABUS)
    store = open_store(settings.database_url)
    syllabus = resolve(settings, "demo", store)
    assert [ch.id for ch in syllabus.chapters] == ["a", "b"]
    # A file wins over the database (and the API refuses to store one beside a file).
    write_syllabus(tmp_path / "exams", "demo", [("z", 2)])
    assert [ch.id for ch in resolve(settings, "demo", store).chapters] == ["z"]
    # And `enqueue --dry-run` on the CLI reads it from the database when there is no file.
    (tmp_path / "exams" / "demo" / "syllabus.json").unlink()
    from producer.cli import main

    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("EXAMS_DIR", str(tmp_path / "exams"))
    from examforge.settings import load_settings

    load_settings.cache_clear()
    try:
        assert main(["enqueue", "demo", "--dry-run", "--json"]) == 0
        assert main(["enqueue", "nope", "--dry-run"]) == 2
    finally:
        load_settings.cache_clear()


def test_status_questions_export_and_metrics_after_a_run(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        assert _run_to_end(c)["state"] == "done"
        status = c.get("/exams/demo").json()
        assert status["state"] == "done" and status["questions"] == {"done": 10, "target": 10}
        assert [ch["id"] for ch in status["chapter_list"]] == ["a", "b"]
        # Keyset pages: every question once, in id order.
        seen, after = [], 0
        while True:
            page = c.get("/exams/demo/questions", params={"limit": 3, "after": after}).json()
            seen += page["items"]
            if page["next"] is None:
                break
            after = page["next"]
        assert len(seen) == 10 and len({q["id"] for q in seen}) == 10
        assert [q["id"] for q in seen] == sorted(q["id"] for q in seen)
        assert all(len(q["choices"]) == 4 and 0 <= q["answer_index"] < 4 for q in seen)
        store = c.app.state.ctx.store
        for fmt in ("jsonl", "json", "csv"):
            r = c.get("/exams/demo/export", params={"format": fmt})
            assert r.status_code == 200
            assert r.headers["content-disposition"] == f'attachment; filename="demo.{fmt}"'
            assert r.content == render(store.iter_questions("demo"), fmt).encode()
        metrics = c.get("/metrics").text
        assert 'examforge_exams{state="done"} 1.0' in metrics
        assert 'examforge_exam_questions_stored{exam="demo"} 10.0' in metrics
        assert 'examforge_exam_calls_total{exam="demo",outcome="used"} 3.0' in metrics
        assert 'examforge_exam_tokens_total{exam="demo",kind="completion"}' in metrics
        assert 'examforge_exam_cost_usd_total{exam="demo"}' in metrics


def test_a_page_is_stable_while_questions_are_stored(make_settings, mock_llm):
    with api(make_settings, mock_llm) as c:
        c.put("/exams/demo", json=SYLLABUS)
        _run_to_end(c)
        first = c.get("/exams/demo/questions", params={"limit": 4}).json()
        c.put("/exams/demo", json={"title": "Demo", "chapters": [
            {"id": "a", "title": "A", "questions": 16}, {"id": "b", "title": "B", "questions": 4}]})
        _run_to_end(c, key="k2")
        # The next page after the first one starts where it ended; new ones come at the end.
        rest = c.get("/exams/demo/questions", params={"limit": 100,
                                                      "after": first["next"]}).json()
        ids = [q["id"] for q in first["items"] + rest["items"]]
        assert len(ids) == len(set(ids)) == 20


def test_the_openapi_document_declares_models_and_problems(make_settings):
    with api(make_settings) as c:
        spec = c.get("/openapi.json").json()
    assert "Problem" in spec["components"]["schemas"]
    paths = spec["paths"]
    expected = {("/exams", "get"), ("/exams/{slug}", "put"), ("/exams/{slug}", "get"),
                ("/exams/{slug}/runs", "post"), ("/exams/{slug}/runs", "get"),
                ("/runs/{run_id}", "get"), ("/runs/{run_id}/cancel", "post"),
                ("/runs/{run_id}/events", "get"), ("/exams/{slug}/questions", "get"),
                ("/exams/{slug}/export", "get"), ("/healthz", "get"), ("/metrics", "get"),
                ("/me", "get"),
                ("/exams/{slug}/sources/{name}", "put"), ("/exams/{slug}/sources/{name}", "delete"),
                ("/exams/{slug}/sources", "get"),
                # The review (producer/api/review.py).
                ("/exams/{slug}/review", "get"),
                ("/exams/{slug}/chapters/{chapter_id}/questions", "get"),
                ("/exams/{slug}/questions/{question_id}", "get"),
                ("/exams/{slug}/questions/{question_id}", "patch"),
                ("/exams/{slug}/questions/{question_id}/history", "get"),
                ("/exams/{slug}/questions/{question_id}/approve", "post"),
                ("/exams/{slug}/questions/{question_id}/reject", "post"),
                # Who calls, and the audit (producer/api/auth.py, audit.py).
                ("/me", "get"), ("/audit", "get"),
                ("/exams/{slug}/review/approve", "post")}
    assert {(p, m) for p, ops in paths.items() for m in ops} == expected
    for (path, method) in expected:
        op = paths[path][method]
        for code, resp in op["responses"].items():
            if code.startswith(("4", "5")):
                assert list(resp["content"]) == ["application/problem+json"], (path, code)
        if path != "/healthz":
            assert "401" in op["responses"], path
    put = paths["/exams/{slug}"]["put"]
    assert put["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "title", "chapters"]
    assert {"201", "200", "409", "422", "413"} <= set(put["responses"])
    post = paths["/exams/{slug}/runs"]["post"]
    assert {"202", "400", "422"} <= set(post["responses"])
    assert post["responses"]["202"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RunOut"}
    for path, method in (("/exams/{slug}/questions/{question_id}", "patch"),
                         ("/exams/{slug}/questions/{question_id}/approve", "post"),
                         ("/exams/{slug}/questions/{question_id}/reject", "post")):
        op = paths[path][method]
        assert {"200", "409", "428", "422", "404"} <= set(op["responses"]), path
        assert "ETag" in op["responses"]["200"]["headers"]
        assert any(p["name"] == "If-Match" for p in op["parameters"])
    json.dumps(spec)  # serialisable as is
