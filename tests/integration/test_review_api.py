"""The review through the HTTP API (producer/api/review.py), in-process, on SQLite and the
real PostgreSQL: a chapter's questions with their review state and version, approve, reject,
edit with its history and its author, the 409 of a stale save, 428 without a version, and
exports of approved questions only."""

from __future__ import annotations

import csv
import io
import json

import pytest
from api_support import AUTH, TOKEN, api, wait_run

from producer.api.runs import client_of

SYLLABUS = {"title": "Review", "chapters": [
    {"id": "a", "title": "Chapter A", "questions": 4, "difficulty": "hard"},
    {"id": "b", "title": "Chapter B", "questions": 3}]}
OTHER_TOKEN = "second-reviewer"


@pytest.fixture
def client(make_settings, mock_llm, db_url):
    with api(make_settings, mock_llm, database_url=db_url,
             api_tokens=f"{TOKEN},{OTHER_TOKEN}") as c:
        assert c.put("/exams/rev", json=SYLLABUS).status_code == 201
        run = c.post("/exams/rev/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        yield c


def _chapter(client, chapter="a"):
    r = client.get(f"/exams/rev/chapters/{chapter}/questions")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_chapter_lists_its_questions_for_review(client):
    page = _chapter(client)
    assert page["title"] == "Chapter A" and [q["number"] for q in page["items"]] == [1, 2, 3, 4]
    q = page["items"][0]
    assert (q["review"], q["version"], q["reviewed_by"], q["edited"]) == (
        "unreviewed", 1, None, False)
    assert q["difficulty"] == "hard" and "verdict" in q and "source" in q
    one = client.get(f"/exams/rev/questions/{q['id']}")
    assert one.status_code == 200 and one.headers["etag"] == '"1"'
    summary = client.get("/exams/rev/review").json()
    assert summary["totals"] == {"questions": 7, "unreviewed": 7, "approved": 0,
                                 "rejected": 0, "disputed": summary["totals"]["disputed"],
                                 "stale": 0}
    assert [c["chapter_id"] for c in summary["chapters"]] == ["a", "b"]
    assert client.get("/exams/rev/chapters/zz/questions").status_code == 404
    assert client.get("/exams/nope/chapters/a/questions").status_code == 404


def test_approve_edit_reject_and_what_export_writes(client):
    a = _chapter(client)["items"]
    b = _chapter(client, "b")["items"]
    r = client.post(f"/exams/rev/questions/{a[0]['id']}/approve", headers={"If-Match": '"1"'})
    assert r.status_code == 200, r.text
    assert r.json()["review"] == "approved" and r.headers["etag"] == '"2"'
    assert r.json()["reviewed_by"] == client_of(f"Bearer {TOKEN}", True)

    edited = client.patch(f"/exams/rev/questions/{a[1]['id']}", json={
        "version": 1, "question": "Which edited question is this?", "answer_index": 0})
    assert edited.status_code == 200, edited.text
    assert edited.json()["version"] == 2 and edited.json()["edited"] is True
    client.post(f"/exams/rev/questions/{a[1]['id']}/approve", json={"version": 2})
    history = client.get(f"/exams/rev/questions/{a[1]['id']}/history").json()["items"]
    assert [h["action"] for h in history] == ["edit", "approve"]
    assert history[0]["changes"]["question"] == [a[1]["question"],
                                                 "Which edited question is this?"]
    assert history[0]["client"] == client_of(f"Bearer {TOKEN}", True) and history[0]["at"]

    r = client.post(f"/exams/rev/questions/{b[0]['id']}/reject",
                    json={"version": 1, "note": "the key is wrong"})
    assert r.status_code == 200 and r.json()["review"] == "rejected"

    # Every export leaves the rejected one out; approved_only writes the two approved ones,
    # the edited one with its edited text.
    everything = [json.loads(line) for line in
                  client.get("/exams/rev/export").text.splitlines()]
    assert len(everything) == 6 and b[0]["question"] not in {q["question"] for q in everything}
    approved = [json.loads(line) for line in client.get(
        "/exams/rev/export", params={"approved_only": "true"}).text.splitlines()]
    assert [(q["chapter_id"], q["number"]) for q in approved] == [("a", 1), ("a", 2)]
    assert approved[1]["question"] == "Which edited question is this?"
    assert approved[1]["answer_index"] == 0
    rows = list(csv.DictReader(io.StringIO(client.get(
        "/exams/rev/export", params={"format": "csv", "approved_only": "true"}).text)))
    assert len(rows) == 2
    xml = client.get("/exams/rev/export", params={"format": "moodle-xml",
                                                  "approved_only": "true"})
    assert xml.status_code == 200 and xml.text.count("<question type=\"multichoice\"") == 2

    summary = client.get("/exams/rev/review").json()["totals"]
    assert (summary["approved"], summary["rejected"]) == (2, 1)


def test_the_second_of_two_saves_from_one_version_gets_409(client):
    q = _chapter(client)["items"][2]
    other = {"Authorization": f"Bearer {OTHER_TOKEN}"}
    first = client.patch(f"/exams/rev/questions/{q['id']}",
                         json={"explanation": "First reviewer's explanation."},
                         headers={"If-Match": '"1"'})
    assert first.status_code == 200, first.text
    second = client.patch(f"/exams/rev/questions/{q['id']}",
                          json={"explanation": "Second reviewer's explanation."},
                          headers={**other, "If-Match": '"1"'})
    assert second.status_code == 409, second.text
    problem = second.json()
    assert second.headers["content-type"] == "application/problem+json"
    assert problem["version"] == 2 and second.headers["etag"] == '"2"'
    assert problem["question"]["explanation"] == "First reviewer's explanation."
    assert "version 2, not 1" in problem["detail"]
    # Nothing of the second save was applied, and a retry from the current version is.
    now = client.get(f"/exams/rev/questions/{q['id']}").json()
    assert now["explanation"] == "First reviewer's explanation." and now["version"] == 2
    again = client.post(f"/exams/rev/questions/{q['id']}/approve", headers={
        **other, "If-Match": '"2"'})
    assert again.status_code == 200
    assert again.json()["reviewed_by"] == client_of(f"Bearer {OTHER_TOKEN}", True)
    assert client.post(f"/exams/rev/questions/{q['id']}/reject",
                       json={"version": 2}).status_code == 409


def test_bad_requests(client):
    q = _chapter(client)["items"][3]
    url = f"/exams/rev/questions/{q['id']}"
    assert client.post(url + "/approve").status_code == 428
    assert client.patch(url, json={"question": "No version?"}).status_code == 428
    assert client.post(url + "/approve", headers={"If-Match": "soon"}).status_code == 400
    assert client.post(url + "/approve", json={"version": 2},
                       headers={"If-Match": '"1"'}).status_code == 400
    for body in ({"version": 1, "choices": ["x", "x", "y", "z"]},
                 {"version": 1, "choices": ["x", "y"]},
                 {"version": 1, "answer_index": 7},
                 {"version": 1, "difficulty": "extreme"},
                 {"version": 1, "number": 9}):
        r = client.patch(url, json=body)
        assert r.status_code == 422, (body, r.text)
    assert client.get(url).json()["version"] == 1
    assert client.post("/exams/rev/questions/999999/approve",
                       json={"version": 1}).status_code == 404
    assert client.post(url + "/approve", json={"version": 1},
                       headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(url).json()["review"] == "unreviewed"
    assert AUTH  # the fixture's client carries the first token
