"""The review of every item type (issue 32) through the HTTP API, on SQLite and the real
PostgreSQL: a mixed chapter generated and blind-solved by a run against the mock lists each
item with its type and answer fields (and the solver's answer); an edit of each type's
answer fields is validated as a generated item of that type is (422 otherwise, nothing
changed), recorded in the history, voids the verdict, and is what every export writes."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from api_support import api, wait_run

TYPES = {"mcq": 2, "multi": 2, "truefalse": 2, "short": 2, "numeric": 2}
SYLLABUS = {"title": "Mixed", "verify": "flag", "chapters": [
    {"id": "a", "title": "Chapter A", "questions": 10, "types": TYPES}]}


@pytest.fixture
def client(make_settings: Any, mock_llm: Any, db_url: str) -> Any:
    with api(make_settings, mock_llm, database_url=db_url) as c:
        assert c.put("/exams/mix", json=SYLLABUS).status_code == 201
        run = c.post("/exams/mix/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        yield c


def _items(client: Any) -> dict[str, list[dict[str, Any]]]:
    r = client.get("/exams/mix/chapters/a/questions")
    assert r.status_code == 200, r.text
    out: dict[str, list[dict[str, Any]]] = {}
    for q in r.json()["items"]:
        out.setdefault(q["type"], []).append(q)
    return out


def test_each_type_is_listed_with_its_answer_fields_and_verdict(client: Any) -> None:
    items = _items(client)
    assert {k: len(v) for k, v in items.items()} == TYPES
    multi, tf, short, num = (items[k][0] for k in ("multi", "truefalse", "short", "numeric"))
    assert len(multi["correct"]) >= 2 and 4 <= len(multi["choices"]) <= 6
    assert multi["answer_index"] == -1 and multi["accepted"] is None
    assert isinstance(tf["answer"], bool) and tf["choices"] == []
    assert short["accepted"] and num["value"] is not None and num["tolerance"] >= 0
    for q in (multi, tf, short, num):
        assert q["verdict"] == "agreed" and q["solved_answer"] is not None
    assert items["mcq"][0]["correct"] is None and items["mcq"][0]["solved_answer"] is None


def test_an_edit_of_each_type_is_validated_as_that_type(client: Any) -> None:
    items = _items(client)
    multi, tf, short, num = (items[k][0] for k in ("multi", "truefalse", "short", "numeric"))
    mcq = items["mcq"][0]

    def patch(q: dict[str, Any], **body: Any) -> Any:
        return client.patch(f"/exams/mix/questions/{q['id']}",
                            json={"version": q["version"], **body})

    bad = [
        (multi, {"correct": [0]}, "correct: must name 2 or more correct choices"),
        (multi, {"choices": ["a", "b", "c"]}, None),  # the schema's 4 to 6
        (tf, {"answer": "yes"}, None),
        (tf, {"choices": ["True", "False", "x", "y"]}, "choices: a truefalse item has no"),
        (short, {"accepted": ["Paris", "PARIS"]}, "accepted: two answers are the same"),
        (num, {"tolerance": -1}, None),
        (num, {"relative": True, "tolerance": 5}, "tolerance: a relative tolerance must be"),
        (mcq, {"accepted": ["x"]}, "accepted: not a field of a mcq item"),
        (tf, {"answer_index": 1}, "answer_index: not a field of a truefalse item"),
        (num, {"type": "mcq"}, None),  # the type is not editable
    ]
    for q, body, detail in bad:
        r = patch(q, **body)
        assert r.status_code == 422, (body, r.text)
        if detail:
            assert detail in r.text, (body, r.text)
    assert _items(client) == items  # nothing changed

    r = patch(multi, correct=[0, 1, 3])
    assert r.status_code == 200, r.text
    assert r.json()["correct"] == [0, 1, 3] and r.json()["verdict"] == "pending"
    r = patch(tf, answer=not tf["answer"])
    assert r.status_code == 200 and r.json()["answer"] is (not tf["answer"])
    r = patch(short, accepted=["Paris", "Paris, France"])
    assert r.status_code == 200 and r.json()["accepted"] == ["Paris", "Paris, France"]
    r = patch(num, value=42.5, tolerance=0.1, relative=False, unit="ms")
    assert r.status_code == 200, r.text
    assert (r.json()["value"], r.json()["unit"], r.json()["solved_answer"]) == (42.5, "ms", None)
    history = client.get(f"/exams/mix/questions/{num['id']}/history").json()["items"]
    assert history[0]["changes"]["value"] == [num["value"], 42.5]

    # Every export writes the edited answers.
    lines = [json.loads(line) for line in
             client.get("/exams/mix/export?format=jsonl").text.splitlines()]
    by_id = {(q["type"], q["number"]): q for q in lines}
    assert by_id[("multi", multi["number"])]["correct"] == [0, 1, 3]
    assert by_id[("numeric", num["number"])]["value"] == 42.5
    table = list(csv.DictReader(io.StringIO(client.get("/exams/mix/export?format=csv").text)))
    assert {r["type"] for r in table} == set(TYPES)
    moodle = client.get("/exams/mix/export?format=moodle-xml").text
    assert "<text>42.5</text>" in moodle and "<tolerance>0.1</tolerance>" in moodle
    gift = client.get("/exams/mix/export?format=gift").text
    assert "#42.5:0.1" in gift and "=%100%Paris, France" in gift


def test_the_questions_page_carries_each_type_and_its_answer_fields(client: Any) -> None:
    page = client.get("/exams/mix/questions").json()
    kinds = {q["type"]: q for q in page["items"]}
    assert set(kinds) == set(TYPES)
    assert isinstance(kinds["truefalse"]["answer"], bool)
    assert kinds["numeric"]["value"] is not None and kinds["multi"]["correct"]
    assert kinds["mcq"]["answer"] is None and kinds["mcq"]["answer_index"] in range(4)


def test_the_mixed_chapter_exports_to_all_seven_formats(client: Any) -> None:
    """Syllabus, generation, the blind solve, the review's list and every export: each
    format holds the ten items, each type in its form."""
    import zipfile
    import xml.etree.ElementTree as ET

    def get(fmt: str) -> Any:
        r = client.get(f"/exams/mix/export?format={fmt}")
        assert r.status_code == 200, (fmt, r.text[:200])
        return r

    assert len(get("jsonl").text.splitlines()) == 10
    assert {q["type"] for q in get("json").json()} == set(TYPES)
    assert len(list(csv.DictReader(io.StringIO(get("csv").text)))) == 10
    moodle = ET.fromstring(get("moodle-xml").content)
    assert sorted(q.get("type") for q in moodle if q.get("type") != "category") == sorted(
        ["multichoice", "multichoice", "multichoice", "multichoice", "truefalse", "truefalse",
         "shortanswer", "shortanswer", "numerical", "numerical"])
    gift = get("gift").text
    assert gift.count("::a-00") == 10
    assert gift.count("{\n\tT\n") + gift.count("{\n\tF\n") == 2
    with zipfile.ZipFile(io.BytesIO(get("qti").content)) as zf:
        xml = next(zf.read(n) for n in zf.namelist() if n.endswith(".xml")
                   and "assessment_meta" not in n and "manifest" not in n).decode()
    for kind in ("multiple_choice_question", "multiple_answers_question", "true_false_question",
                 "short_answer_question", "numerical_question"):
        assert xml.count(f"<fieldentry>{kind}</fieldentry>") == 2, kind
    with zipfile.ZipFile(io.BytesIO(get("anki").content)) as zf:
        assert "collection.anki2" in zf.namelist()
