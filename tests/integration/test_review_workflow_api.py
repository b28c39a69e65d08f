"""The review a department works through, in the HTTP API (producer/api/review.py), on SQLite
and the real PostgreSQL: each filter and its count, a bulk approve that approves nothing over
a newer edit, the solver's choice (`solved_index`), and the numbers withdrawn questions keep
(issue 30)."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import TOKEN, api
from sqlalchemy import update

from examforge.output import Question
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from producer.api.runs import client_of
from storage.base import Q

OTHER = {"Authorization": "Bearer second-reviewer"}
SLUG = "wf"


@pytest.fixture
def client(make_settings, db_url, tmp_path):
    with api(make_settings, database_url=db_url,
             api_tokens=f"{TOKEN},second-reviewer") as c:
        store = c.app.state.ctx.store
        path = write_syllabus(tmp_path / "exams", SLUG, [("a", 6), ("b", 2)])
        store.sync_exam(SLUG, load_syllabus(path, max_questions=1000))
        store.import_questions(SLUG, {
            "a": [Question(f"What is item {i} of the first list?", (f"w{i}", f"x{i}", f"y{i}",
                                                                      f"z{i}"), 1, f"because {i}")
                  for i in range(6)],
            "b": [Question(f"Which term {i} of the glossary?", (f"p{i}", f"q{i}", f"r{i}",
                                                                  f"s{i}"), 2, f"since {i}")
                  for i in range(2)]}, "test")
        yield c


def _store(client: Any) -> Any:
    return client.app.state.ctx.store


def _items(client: Any, chapter: str = "a", only: str | None = None) -> list[dict[str, Any]]:
    r = client.get(f"/exams/{SLUG}/chapters/{chapter}/questions",
                   params={"filter": only} if only else None)
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _verdicts(client: Any, ids: list[int], verdict: str, solved: Any) -> None:
    """Verdicts as the blind solve books them (this exam was never verified)."""
    with _store(client).engine.begin() as conn:
        conn.execute(update(Q).where(Q.c.id.in_(ids)).values(verdict=verdict,
                                                             solved_index=solved))


def _one_of_each(client: Any) -> dict[str, int]:
    """Chapter a's six questions put in every state a filter shows: {state: id}."""
    ids = [q["id"] for q in _items(client)]
    names = ["approved", "edited", "rejected", "disputed", "stale", "unreviewed"]
    by = dict(zip(names, ids))
    _verdicts(client, ids, "agreed", Q.c.answer_index)
    _verdicts(client, [by["disputed"]], "disputed", 3)
    url = f"/exams/{SLUG}/questions"
    assert client.post(f"{url}/{by['approved']}/approve", json={"version": 1}).status_code == 200
    assert client.patch(f"{url}/{by['edited']}", json={
        "version": 1, "explanation": "A reviewer's explanation."}).status_code == 200
    assert client.post(f"{url}/{by['rejected']}/reject", json={"version": 1}).status_code == 200
    with _store(client).engine.begin() as conn:  # as `enqueue --regenerate` leaves one
        conn.execute(update(Q).where(Q.c.id == by["stale"]).values(
            review="stale", stale="its title or prompt changed"))
    return by


def test_each_filter_shows_its_questions_and_every_count(client):
    by = _one_of_each(client)
    expected = {"disputed": [by["disputed"]],
                "unreviewed": [by["edited"], by["disputed"], by["unreviewed"]],
                "edited": [by["edited"]], "stale": [by["stale"]],
                "approved": [by["approved"]], "rejected": [by["rejected"]]}
    for name, ids in expected.items():
        r = client.get(f"/exams/{SLUG}/chapters/a/questions", params={"filter": name})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["filter"] == name and [q["id"] for q in page["items"]] == ids, name
        assert page["counts"] == {n: len(i) for n, i in expected.items()}, name
    every = client.get(f"/exams/{SLUG}/chapters/a/questions").json()
    assert every["filter"] is None and len(every["items"]) == 6
    assert every["counts"] == {n: len(i) for n, i in expected.items()}
    # Another chapter counts its own.
    assert client.get(f"/exams/{SLUG}/chapters/b/questions").json()["counts"] == {
        "disputed": 0, "unreviewed": 2, "edited": 0, "stale": 0, "approved": 0, "rejected": 0}
    # The summary counts the same, per chapter and in all: what the page's filters show.
    summary = client.get(f"/exams/{SLUG}/review").json()
    counts = {n: len(i) for n, i in expected.items()}
    assert [c["filters"] for c in summary["chapters"]] == [
        counts, {**dict.fromkeys(counts, 0), "unreviewed": 2}]
    assert summary["filters"] == {**counts, "unreviewed": counts["unreviewed"] + 2}
    bad = client.get(f"/exams/{SLUG}/chapters/a/questions", params={"filter": "pending"})
    assert bad.status_code == 422 and "filter" in bad.text


def test_a_question_withdrawn_as_disputed_is_in_no_filter_but_all(client):
    """VERIFY=replace withdrew it: history, not a reviewer's work; counted nowhere."""
    first = _items(client)[0]["id"]
    _verdicts(client, [first], "disputed", 0)
    _store(client).withdraw(SLUG, [first], "disputed")
    for name in ("disputed", "unreviewed", "rejected"):
        assert first not in [q["id"] for q in _items(client, only=name)], name
    page = client.get(f"/exams/{SLUG}/chapters/a/questions").json()
    assert page["counts"]["disputed"] == 0 and page["counts"]["unreviewed"] == 5
    assert client.get(f"/exams/{SLUG}/review").json()["filters"]["unreviewed"] == 7
    assert [q["withdrawn"] for q in page["items"]][-1] == "disputed"


def test_bulk_approve_leaves_a_question_edited_meanwhile_with_its_current_version(client):
    by = _one_of_each(client)
    shown = _items(client, only="unreviewed")
    assert [q["id"] for q in shown] == [by["edited"], by["disputed"], by["unreviewed"]]
    # Another reviewer saves one of them after the page read it.
    theirs = client.patch(f"/exams/{SLUG}/questions/{by['disputed']}", headers={
        **OTHER, "If-Match": '"1"'}, json={"explanation": "The other reviewer's reason."})
    assert theirs.status_code == 200, theirs.text
    r = client.post(f"/exams/{SLUG}/review/approve", json={"items": [
        {"id": q["id"], "version": q["version"]} for q in shown]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["approved"] == 2
    assert [(i["id"], i["status"], i["result"], i["version"]) for i in out["items"]] == [
        (by["edited"], 200, "approved", 3), (by["disputed"], 409, "conflict", 2),
        (by["unreviewed"], 200, "approved", 2)]
    refused = out["items"][1]
    assert "version 2, not 1" in refused["detail"]
    assert refused["question"]["explanation"] == "The other reviewer's reason."
    assert refused["question"]["review"] == "unreviewed"
    # Nothing approved over the newer edit; the others approved, each with its history row.
    store = _store(client)
    assert store.review_question(SLUG, by["disputed"])["review"] == "unreviewed"
    assert [h["action"] for h in store.question_history(SLUG, by["disputed"])] == ["edit"]
    me = client_of(f"Bearer {TOKEN}", True)
    for qid in (by["edited"], by["unreviewed"]):
        now = store.review_question(SLUG, qid)
        assert (now["review"], now["reviewed_by"]) == ("approved", me)
        assert store.question_history(SLUG, qid)[-1]["action"] == "approve"
    # Approved again from the current version: approved.
    again = client.post(f"/exams/{SLUG}/review/approve", json={"items": [
        {"id": by["disputed"], "version": refused["version"]}]}).json()
    assert again["items"][0]["status"] == 200 and again["approved"] == 1
    assert store.review_question(SLUG, by["disputed"])["review"] == "approved"


def test_bulk_approve_answers_each_question_it_cannot_approve(client):
    by = _one_of_each(client)
    r = client.post(f"/exams/{SLUG}/review/approve", json={"items": [
        {"id": by["rejected"], "version": 2}, {"id": 999_999, "version": 1},
        {"id": by["approved"], "version": 2}]})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [(i["status"], i["result"]) for i in items] == [
        (409, "conflict"), (404, "not_found"), (200, "approved")]
    assert "rejected" in items[0]["detail"] and items[0]["question"]["review"] == "rejected"
    assert items[1]["question"] is None and items[1]["version"] is None
    assert items[2]["version"] == 2  # approved already: nothing changed
    url = f"/exams/{SLUG}/review/approve"
    twice = client.post(url, json={"items": [{"id": by["stale"], "version": 1}] * 2})
    assert twice.status_code == 400 and "twice" in twice.json()["detail"]
    for body in ({"items": []}, {"items": [{"id": by["stale"]}]},
                 {"items": [{"id": by["stale"], "version": "1"}]}, {}):
        assert client.post(url, json=body).status_code == 422, body
    assert client.post("/exams/nope/review/approve", json={"items": [
        {"id": by["stale"], "version": 1}]}).status_code == 404
    assert _store(client).review_question(SLUG, by["stale"])["review"] == "stale"


def test_bulk_approve_is_in_the_openapi_document_item_by_item(client):
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/exams/{slug}/review/approve"]["post"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BulkApproveOut"}
    result = spec["components"]["schemas"]["BulkApproveResult"]
    assert result["properties"]["status"]["enum"] == [200, 404, 409]
    assert set(result["required"]) >= {"id", "status", "version", "question"}
    params = spec["paths"]["/exams/{slug}/chapters/{chapter_id}/questions"]["get"]["parameters"]
    [only] = [p for p in params if p["name"] == "filter"]
    assert only["in"] == "query" and not only.get("required")


def test_solved_index_is_the_solvers_choice_while_a_verdict_is_booked(client):
    a, b, c, d = _items(client)[:4]
    _verdicts(client, [a["id"]], "agreed", a["answer_index"])
    _verdicts(client, [b["id"]], "disputed", (b["answer_index"] + 1) % 4)
    _verdicts(client, [c["id"]], "pending", None)
    shown = {q["id"]: q for q in _items(client)}
    assert [(shown[q["id"]]["verdict"], shown[q["id"]]["solved_index"]) for q in (a, b, c, d)
            ] == [("agreed", a["answer_index"]), ("disputed", (b["answer_index"] + 1) % 4),
                  ("pending", None), (None, None)]
    one = client.get(f"/exams/{SLUG}/questions/{b['id']}").json()
    assert one["solved_index"] == (b["answer_index"] + 1) % 4
    # An edit of the key voids the verdict: no choice shown for a key it was not made for.
    edited = client.patch(f"/exams/{SLUG}/questions/{b['id']}", json={
        "version": 1, "answer_index": (b["answer_index"] + 2) % 4})
    assert edited.status_code == 200, edited.text
    assert (edited.json()["verdict"], edited.json()["solved_index"]) == ("pending", None)


def test_withdrawn_questions_come_after_the_bank_with_the_number_they_had(client):
    items = _items(client)
    third = items[2]
    assert client.post(f"/exams/{SLUG}/questions/{third['id']}/reject",
                       json={"version": 1}).status_code == 200
    after = _items(client)
    assert [(q["number"], q["withdrawn"]) for q in after] == [
        (1, None), (2, None), (4, None), (5, None), (6, None), (3, "rejected")]
    # Its replacement takes number 3 in the bank: the withdrawn one keeps #3, after the bank.
    _store(client).import_questions(SLUG, {"a": [Question(
        "Which replacement fills the free number?", ("k", "l", "m", "n"), 0, "it does")]},
        "test")
    after = _items(client)
    bank = [q for q in after if q["withdrawn"] is None]
    gone = [q for q in after if q["withdrawn"] is not None]
    assert [q["number"] for q in bank] == [1, 2, 3, 4, 5, 6]
    assert [(q["id"], q["number"], q["review"]) for q in gone] == [
        (third["id"], 3, "rejected")]
    assert after[-1]["id"] == third["id"]  # the bank first, then the withdrawn
    assert bank[2]["question"] == "Which replacement fills the free number?"
