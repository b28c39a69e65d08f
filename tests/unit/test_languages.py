"""A language per exam (issue 31): the known tags in one place (examforge.languages), the
prompts naming the language, and validation refusing choices that stand for the others or
name one by its letter in each supported language, not only in English. The worker writes
and validates in the language its slice records, whatever its own environment."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakellm import reply

from examforge.balance import positional
from examforge.errors import Rejection
from examforge.languages import DEFAULT_LANGUAGE, LANGUAGES, check_tag, known_tags
from examforge.output import Question, parse_questions, positional_reason
from examforge.prompt import Label, build_messages
from examforge.syllabus import Chapter, Syllabus
from examforge import verify
from helpers import write_syllabus


def test_the_known_tags_are_one_list_with_every_part_each_language_needs():
    assert {"en", "fa", "ar", "ru"} <= set(known_tags()) and DEFAULT_LANGUAGE == "en"
    assert list(known_tags()) == sorted(LANGUAGES)
    for tag, lang in LANGUAGES.items():
        assert lang.tag == tag and lang.name and lang.label == f"{lang.name} ({tag})"
        assert lang.phrases and lang.choice_words and lang.letters and lang.conjunctions
        # Each language's own phrases are refused as they are written.
        for phrase in lang.phrases:
            assert lang.positional(phrase) is not None, (tag, phrase)
    assert check_tag("fa") == "fa"
    with pytest.raises(ValueError, match="known tags: ar, en, fa, ru"):
        check_tag("xx")


# (language, choices that refer to the others, choices that do not): each supported
# language's own "all / none of the above", its letters after a choice's name, and two
# letters joined; written as people write them (with the zero-width non-joiner, the Arabic
# yeh and kaf in Persian, diacritics, ё).
CASES = {
    "en": (["All of the above", "None of these", "Both A and C", "option B",
            "Neither of the above", "answer (D)", "A or B"],
           ["A load balancer", "Vitamin D deficiency", "all of them are mammals",
            "The answer is a list", "a or b"]),
    "fa": (["همه موارد", "همه‌ی موارد", "همه موارد فوق", "هیچکدام", "هیچ‌کدام",
            "هيچكدام",  # Arabic yeh and kaf
            "هیچ کدام از موارد", "گزینه الف", "گزینه‌ی ب", "الف و ب", "ج یا د",
            "هر دو مورد", "All of the above"],
           ["تهران", "مدیریت هویت و دسترسی", "همه پستانداران", "کلید API و امضای HMAC",
            "افزایش دما"]),
    "ar": (["جميع ما سبق", "جميعُ ما سَبق", "كل ما سبق", "لا شيء مما سبق", "لا شيء مما ذُكر",
            "ليس أيًا مما سبق", "الخيار أ", "الخيار (ب)", "أ و ب", "ج أو د", "None of the above"],
           ["القاهرة", "جميع الثدييات تتنفس الهواء", "مفتاح API", "لا شيء", "الخيار الأفضل"]),
    "ru": (["Все вышеперечисленное", "всё вышеперечисленное", "Ничего из вышеперечисленного",
            "ни один из вышеперечисленных", "вариант А", "Варианты Б и В", "А и Б", "В или Г",
            "оба варианта", "Both A and B"],
           ["Москва", "все млекопитающие", "ключ API и подпись HMAC", "а также другие",
            "вариантов много"]),
}


@pytest.mark.parametrize("tag", sorted(CASES))
def test_a_choice_that_refers_to_the_others_is_refused_in_its_language(tag):
    refused, kept = CASES[tag]
    for text in refused:
        q = Question("Q?", (text, "x1", "x2", "x3"), 1, "because")
        assert positional_reason(q, tag) is not None, (tag, text)
        assert positional(q), (tag, text)  # and an imported one keeps its order
    for text in kept:
        q = Question("Q?", (text, "x1", "x2", "x3"), 1, "because")
        assert positional_reason(q, tag) is None, (tag, text)


def test_another_language_s_phrase_is_only_refused_in_that_language_or_english():
    q = Question("Q?", ("هیچکدام", "x1", "x2", "x3"), 1, "because")
    assert positional_reason(q, "fa") is not None
    assert positional_reason(q, "ru") is None  # not Russian, not English
    english = Question("Q?", ("All of the above", "x1", "x2", "x3"), 1, "because")
    assert all(positional_reason(english, tag) for tag in LANGUAGES)


@pytest.mark.parametrize("tag, explanation", [
    ("fa", "گزینه الف درست است زیرا ..."), ("fa", "پاسخ ب و د نادرست‌اند"),
    ("ar", "الخيار ب صحيح لأن ..."), ("ru", "Вариант Б верен, потому что ..."),
    ("fa", "گزینه B درست است"),
])
def test_an_explanation_naming_a_choice_by_letter_is_refused_where_the_reorder_cannot_fix_it(
        tag, explanation):
    q = Question("Q?", ("w", "x", "y", "z"), 1, explanation)
    assert "explanation" in (positional_reason(q, tag) or "")
    # English ones are rewritten to the new letters when the choices move (examforge.balance).
    assert positional_reason(Question("Q?", ("w", "x", "y", "z"), 1, "Option B is right."),
                             "en") is None


def _reply(*questions: dict[str, Any]) -> str:
    return json.dumps({"questions": list(questions)})


def _q(text: str, choices: list[str], explanation: str = "توضیح") -> dict[str, Any]:
    return {"question": text, "choices": choices, "answer_index": 0, "explanation": explanation}


def test_parse_questions_rejects_positional_questions_as_such_and_keeps_the_rest():
    content = _reply(_q("پایتخت ایران کدام است؟", ["تهران", "شیراز", "تبریز", "مشهد"]),
                     _q("کدام درست است؟", ["الف", "ب", "همه موارد", "هیچکدام"]),
                     _q("کدام شهر بندری است؟", ["بندرعباس", "اراک", "قم", "یزد"],
                        "گزینه الف درست است"))
    parsed = parse_questions(content, "stop", None, set(), language="fa")
    assert [q.question for q in parsed.questions] == ["پایتخت ایران کدام است؟"]
    assert parsed.rejected == {Rejection.positional: 2}
    # The same reply in an English exam: the Persian phrases are not English, but the
    # explanation's Persian letter is no concern there either.
    english = parse_questions(content, "stop", None, set())
    assert len(english.questions) == 3


def test_the_generation_prompt_names_the_language_after_the_exam_s_fields():
    fa = Chapter(id="c1", title="فصل اول", questions=5, language="fa")
    en = Chapter(id="c1", title="Chapter one", questions=5)
    user = build_messages("ex", "Exam", fa, 5, [])[1]["content"].splitlines()
    assert user[:2] == ["Exam: ex", "Exam title: Exam"]
    assert user[2].startswith(f"{Label.language.value}: Persian (fa). Write every question, "
                              "every choice and every explanation in Persian")
    assert "cite the material's passages by their ids, as they are" in user[2]
    assert user[3:5] == ["Chapter id: c1", "Chapter title: فصل اول"]
    # Two chapters of one exam in one language share the prefix through the language line.
    other = Chapter(id="c2", title="فصل دوم", questions=5, language="fa")
    assert build_messages("ex", "Exam", other, 5, [])[1]["content"].splitlines()[:3] == user[:3]
    # English says nothing: its prompt is what it was before exams had a language.
    english = build_messages("ex", "Exam", en, 5, [])[1]["content"]
    assert "Language:" not in english and english.startswith(
        "Exam: ex\nExam title: Exam\nChapter id: c1\n")
    assert build_messages("ex", "Exam", en, 5, [])[0] == build_messages("ex", "Exam", fa, 5,
                                                                        [])[0]


def test_the_blind_solve_is_told_what_language_it_reads():
    items = [verify.item("پایتخت ایران کدام است؟", ["تهران", "شیراز", "تبریز", "مشهد"])]
    user = verify.build_messages(items, [], language="fa")[1]["content"].splitlines()
    assert user[0] == f"{verify.SOLVE_HEADER}: 1"
    assert user[1].startswith(f"{verify.LANGUAGE_PREFIX}Persian (fa)")
    assert user[2] == "" and user[3] == "Question 1: پایتخت ایران کدام است؟"
    english = verify.build_messages(items, [])[1]["content"]
    assert verify.LANGUAGE_PREFIX not in english
    assert english.startswith(f"{verify.SOLVE_HEADER}: 1\n\nQuestion 1:")


def test_a_syllabus_chapter_takes_the_exam_s_language_unless_it_names_its_own():
    s = Syllabus.model_validate({"title": "T", "language": "fa", "chapters": [
        {"id": "a", "title": "A", "questions": 1},
        {"id": "b", "title": "B", "questions": 1, "language": "en"}]})
    assert s.language == "fa" and [c.language for c in s.chapters] == ["fa", "en"]
    plain = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 1}]})
    assert plain.language == "en" and plain.chapters[0].language == "en"


# ---- the worker: writes and validates in the slice's language ---------------------------


@pytest.fixture
def persian(make_settings):
    """A Persian exam (chapter a) with an English chapter (b), synced into a fresh store,
    and a worker whose client talks to a FakeLLM."""
    from fakellm import FakeLLM

    from examforge.llm import LLMClient
    from examforge.syllabus import load_syllabus
    from runner.pipeline import Runtime
    from storage import open_store

    settings = make_settings()
    path = write_syllabus(settings.exams_dir, "ex", {"title": "آزمون", "language": "fa",
                                                     "chapters": [
        {"id": "a", "title": "فصل اول", "questions": 3},
        {"id": "b", "title": "Chapter b", "questions": 3, "language": "en"}]})
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    fake = FakeLLM()
    rt = Runtime.build(settings, store, LLMClient(settings, transport=fake.transport()))
    try:
        yield rt, fake
    finally:
        rt.close()
        store.engine.dispose()


def test_the_worker_asks_in_the_slice_s_language_and_refuses_positional_choices(persian):
    from runner.pipeline import process_chapter

    rt, fake = persian
    good = [_q("پایتخت ایران کدام شهر است؟", ["تهران", "شیراز", "تبریز", "مشهد"]),
            _q("بلندترین کوه ایران چه نام دارد؟", ["دماوند", "سبلان", "دنا", "الوند"]),
            _q("کدام رود در اصفهان جاری است؟", ["زاینده‌رود", "کارون", "ارس", "سفیدرود"])]
    bad = _q("کدام درست است؟", ["یک", "دو", "سه", "همه موارد"])
    fake.script.append(lambda request, wanted: reply(_reply(bad, *good)))
    assert process_chapter(rt, "ex", "a").outcome == "done"
    user = fake.requests[0]["messages"][-1]["content"]
    assert "\nLanguage: Persian (fa). Write every question" in user
    texts = rt.store.stored_texts("ex")["a"]
    assert sorted(texts) == sorted(q["question"] for q in good)
    assert process_chapter(rt, "ex", "b").outcome == "done"
    assert "Language:" not in fake.requests[-1]["messages"][-1]["content"]
    report = rt.store.status("ex")
    assert report.language == "fa"
    assert [(c.id, c.language) for c in report.chapter_list] == [("a", "fa"), ("b", "en")]


# ---- the API -----------------------------------------------------------------------------


def test_the_api_shows_the_exam_s_chapters_and_questions_language(make_settings, mock_llm):
    from api_support import api, wait_run

    syllabus = {"title": "آزمون", "language": "fa", "chapters": [
        {"id": "a", "title": "فصل اول", "questions": 4},
        {"id": "b", "title": "Chapter b", "questions": 3, "language": "en"}]}
    with api(make_settings, mock_llm) as c:
        assert c.put("/exams/demo", json=syllabus).status_code in (200, 201)
        new = c.get("/exams/demo").json()
        assert new["state"] == "new" and new["language"] == "fa"
        assert [ch["language"] for ch in new["chapter_list"]] == ["fa", "en"]
        run = c.post("/exams/demo/runs", headers={"Idempotency-Key": "k"}).json()
        assert wait_run(c, run["id"])["state"] == "done"
        status = c.get("/exams/demo").json()
        assert status["language"] == "fa"
        assert [ch["language"] for ch in status["chapter_list"]] == ["fa", "en"]
        page = c.get("/exams/demo/questions", params={"limit": 100}).json()["items"]
        assert {(q["chapter_id"], q["language"]) for q in page} == {("a", "fa"), ("b", "en")}
        items = c.get("/exams/demo/chapters/a/questions").json()["items"]
        assert items and {q["language"] for q in items} == {"fa"}
        bad = c.put("/exams/other", json={**syllabus, "language": "xx"})
        assert bad.status_code == 422 and "known tags: ar, en, fa, ru" in bad.text
