"""Sources of an exam made through the API: uploaded with it, size-capped and kept in the
database; a name that points anywhere else is refused (4xx) and the server reads no path a
client names."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import api, wait_run
from pdf_samples import encrypted_pdf, text_pdf

NOTES = "\n\n".join(f"## Topic {i}\n\n" + " ".join(f"fact{i}w{k}" for k in range(150)) + "."
                    for i in range(1, 5))
SYLLABUS = {"title": "Demo", "chapters": [
    {"id": "a", "title": "A", "questions": 6, "sources": ["notes/a.md", "guide.pdf"]},
    {"id": "b", "title": "B", "questions": 2}]}


@pytest.mark.parametrize("path", [
    "/exams/demo/sources/..%2F..%2Fetc%2Fpasswd",
    "/exams/demo/sources/notes%2F..%2F..%2F..%2Fetc%2Fpasswd.md",
    "/exams/demo/sources//etc/passwd",
    "/exams/demo/sources/%2Fetc%2Fpasswd",
    "/exams/demo/sources/.ssh%2Fid_rsa",
    "/exams/demo/sources/notes.exe",
])
def test_a_client_naming_a_server_path_gets_a_4xx_and_nothing_is_stored(
        make_settings: Any, path: str) -> None:
    with api(make_settings) as c:
        r = c.put(path, content=b"x")
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        assert c.get("/exams/demo/sources").json() == {"items": []}


def test_a_syllabus_naming_a_server_path_is_refused(make_settings: Any) -> None:
    with api(make_settings) as c:
        for bad in ("../../etc/passwd", "/etc/passwd"):
            body = {"title": "D", "chapters": [{"id": "a", "title": "A", "questions": 1,
                                                "sources": [bad]}]}
            r = c.put("/exams/demo", json=body)
            assert r.status_code == 422 and "sources" in r.json()["detail"]


def test_uploads_are_checked_capped_and_a_run_reads_them_from_the_database(
        make_settings: Any, mock_llm: Any, tmp_path: Any) -> None:
    with api(make_settings, mock_llm, questions_per_call=3, slice_questions=3) as c:
        assert c.put("/exams/demo", json=SYLLABUS).status_code == 201
        # A run before its sources are uploaded: refused, nothing started.
        r = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k0"})
        assert r.status_code == 422 and "notes/a.md" in r.json()["detail"]
        assert "not uploaded" in r.json()["detail"]
        assert c.get("/exams/demo/runs").json()["items"] == []
        r = c.put("/exams/demo/sources/guide.pdf", content=encrypted_pdf(["x"]))
        assert r.status_code == 422 and "encrypted PDF" in r.json()["detail"]
        r = c.put("/exams/demo/sources/guide.pdf", content=b"x" * 1_000_001)
        assert r.status_code == 413
        r = c.put("/exams/demo/sources/notes/a.md", content=NOTES.encode())
        assert r.status_code == 201 and r.json()["bytes"] == len(NOTES.encode())
        r = c.put("/exams/demo/sources/guide.pdf", content=text_pdf(["Guide page one."]))
        assert r.status_code == 201
        assert [s["name"] for s in c.get("/exams/demo/sources").json()["items"]] == [
            "guide.pdf", "notes/a.md"]
        # The same name in EXAMS_DIR is never read for an API exam.
        (tmp_path / "exams" / "demo").mkdir(parents=True, exist_ok=True)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k1"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        items = c.get("/exams/demo/questions", params={"limit": 100}).json()["items"]
        sources = {q["chapter_id"]: set() for q in items}
        for q in items:
            sources[q["chapter_id"]].add(q["source"])
        assert sources["b"] == {None}
        assert all(s and (s.startswith("notes/a.md, Topic") or s.startswith("guide.pdf, page 1"))
                   for s in sources["a"])
        chapter = c.get("/exams/demo").json()["chapter_list"][0]
        assert chapter["material"]["passages"] == 5 and chapter["material"]["cited"] >= 1
        # A file-based exam takes its sources from its folder: uploads are refused (409).
        (tmp_path / "exams" / "filed").mkdir(parents=True)
        (tmp_path / "exams" / "filed" / "syllabus.json").write_text(
            '{"title": "F", "chapters": [{"id": "a", "title": "A", "questions": 1}]}')
        assert c.put("/exams/filed/sources/n.md", content=b"notes").status_code == 409


def test_an_upload_needs_the_exams_syllabus_first(make_settings: Any) -> None:
    with api(make_settings) as c:
        r = c.put("/exams/nosuch/sources/notes/a.md", content=NOTES.encode())
        assert r.status_code == 404 and "nosuch" in r.json()["detail"], r.text
        assert c.get("/exams/nosuch/sources").json() == {"items": []}


def test_the_uploads_of_an_exam_have_a_total_and_a_413_past_it(make_settings: Any) -> None:
    small = NOTES.encode()[:1000]
    with api(make_settings, api_upload_total_bytes=1500) as c:
        assert c.put("/exams/demo", json=SYLLABUS).status_code == 201
        assert c.put("/exams/demo/sources/notes/a.md", content=small).status_code == 201
        r = c.put("/exams/demo/sources/other.md", content=small)
        assert r.status_code == 413 and "API_UPLOAD_TOTAL_BYTES=1500" in r.json()["detail"]
        # Replacing a file counts its new size, not both.
        assert c.put("/exams/demo/sources/notes/a.md", content=small).status_code == 200
        assert [i["name"] for i in c.get("/exams/demo/sources").json()["items"]] == [
            "notes/a.md"]


def test_an_upload_can_be_deleted_but_not_while_a_run_reads_it(
        make_settings: Any, mock_llm: Any) -> None:
    mock_llm.configure(latency_s=1.0)
    with api(make_settings, mock_llm, questions_per_call=3, slice_questions=3) as c:
        assert c.put("/exams/demo", json=SYLLABUS).status_code == 201
        assert c.put("/exams/demo/sources/notes/a.md", content=NOTES.encode()).status_code == 201
        assert c.put("/exams/demo/sources/guide.pdf",
                     content=text_pdf(["Guide page one."])).status_code == 201
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k1"})
        assert run.status_code in (201, 202), run.text
        r = c.delete("/exams/demo/sources/guide.pdf")
        assert r.status_code == 409 and "run" in r.json()["detail"], r.text
        wait_run(c, run.json()["id"], timeout_s=60)
        assert c.delete("/exams/demo/sources/guide.pdf").status_code == 204
        assert c.delete("/exams/demo/sources/guide.pdf").status_code == 404
        assert [i["name"] for i in c.get("/exams/demo/sources").json()["items"]] == [
            "notes/a.md"]
