"""The mock writes in the prompt's language (issue 31): it reads the Language line examforge
writes, answers a Persian, Arabic or Russian chapter from its corpora (mockllm/corpora.py)
and an English one as before; its distinct questions are never near-duplicates of one
another in their language and its rewordings are caught; its blind solve knows their
answers. End to end through the API: a Persian exam whose mock repeats itself stores
Persian questions and no near-duplicate, refuses an edit that retypes one with Arabic
letters, and its reviewed Moodle bank reads back exactly."""

from __future__ import annotations

import json
import re

import pytest
from api_support import api, wait_run
from test_banks_moodle_xml import read_bank as read_moodle

from examforge import neardup as nd
from examforge.prompt import language_line
from mockllm import corpora
from mockllm.prompt import parse_prompt
from mockllm.solve import solve

ARABIC_SCRIPT = re.compile("[\u0600-\u06ff]")
CYRILLIC = re.compile("[\u0400-\u04ff]")
TITLES = {"fa": "ذخیره‌سازی", "ar": "التخزين", "ru": "Хранение"}


def _body(extra: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": (
        "Exam: ex\nChapter id: a\nChapter title: T\nNumber of questions: 3\n" + extra)}]}


@pytest.mark.parametrize("tag", ["fa", "ar", "ru"])
def test_the_language_line_is_read(tag: str) -> None:
    assert parse_prompt(_body(language_line(tag))).language == tag
    assert parse_prompt(_body("")).language == "en"


@pytest.mark.parametrize("tag", sorted(corpora.CORPORA))
def test_distinct_questions_stay_apart_and_rewordings_are_caught(tag: str) -> None:
    title = TITLES[tag]
    texts = [corpora.make_question(tag, "ex/a", title, s)["question"] for s in range(1, 101)]
    assert len(set(texts)) == 100  # unique past one pass of the array ("part 2")
    texts = texts[:corpora.P * corpora.P]  # pairwise distinct within one pass
    script = CYRILLIC if tag == "ru" else ARABIC_SCRIPT
    assert all(script.search(t) for t in texts)
    assert nd.near_pairs(texts, context=title, language=tag) == []
    checker = nd.Checker()
    again = [(corpora.reword(tag, "ex/a", title, s, v)["question"], texts[s - 1])
             for s in range(1, 50) for v in range(4)]
    assert all(a != b for a, b in again)
    caught = sum(checker.is_near(nd.signature(a, title, tag), nd.signature(b, title, tag))
                 for a, b in again)
    assert caught >= 0.99 * len(again), caught


def test_the_blind_solve_knows_the_answers_in_every_language() -> None:
    lines = []
    keys = []
    for n, tag in enumerate(sorted(corpora.CORPORA), 1):
        q = corpora.make_question(tag, "ex/a", TITLES[tag], n)
        keys.append("ABCD"[q["answer_index"]])
        lines.append(f"Question {n}: {q['question']}")
        lines += [f"{'ABCD'[i]}. {c}" for i, c in enumerate(q["choices"])]
    solved = solve("\n".join(lines), seed=1, error_rate=0.0)
    assert solved.answers == 3 and solved.unknown == 0
    assert [a["choice"] for a in json.loads(solved.content)["answers"]] == keys


def test_a_persian_exam_through_the_api_stores_persian_questions_once(make_settings, mock_llm):
    mock_llm.configure(reword_rate=0.3)
    syllabus = {"title": "آزمون", "language": "fa", "chapters": [
        {"id": "a", "title": "ذخیره‌سازی", "questions": 20},
        {"id": "b", "title": "Storage", "questions": 5, "language": "en"}]}
    with api(make_settings, mock_llm) as c:
        assert c.put("/exams/demo", json=syllabus).status_code in (200, 201)
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        items = c.get("/exams/demo/questions", params={"limit": 100}).json()["items"]
        mine = [q for q in items if q["chapter_id"] == "a"]
        # An edit that retypes another stored question with Arabic letters is a repeat of it.
        retyped = mine[1]["question"].replace("ی", "ي").replace("ک", "ك")
        edit = c.patch(f"/exams/demo/questions/{mine[0]['id']}",
                       json={"question": retyped}, headers={"If-Match": '"1"'})
        assert edit.status_code == 409 and edit.json()["duplicate_of"]["id"] == mine[1]["id"]
        # Reviewed, then exported: the approved Persian questions read back exactly.
        approve = c.post("/exams/demo/review/approve", json={"items": [
            {"id": q["id"], "version": 1} for q in mine[:10]]})
        assert approve.status_code == 200 and approve.json()["approved"] == 10
        bank = c.get("/exams/demo/export", params={"format": "moodle-xml",
                                                   "approved_only": "true"})
        assert bank.status_code == 200
    read = read_moodle(bank.content)
    assert [q["question"] for _, q in read] == [q["question"] for q in mine[:10]]
    assert bank.content.count(b'<div lang="fa" dir="rtl">') == 6 * 10
    persian = [q["question"] for q in items if q["chapter_id"] == "a"]
    english = [q["question"] for q in items if q["chapter_id"] == "b"]
    assert len(persian) == 20 and len(english) == 5
    assert all(ARABIC_SCRIPT.search(t) for t in persian)
    assert not any(ARABIC_SCRIPT.search(t) for t in english)
    assert nd.near_pairs(persian, context="ذخیره‌سازی", language="fa") == []
