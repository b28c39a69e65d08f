"""Difficulty and Bloom levels: the syllabus fields, what each call asks for, what is stored
(examforge.levels), and the mock labelling its questions as asked, like a model."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakellm import reply
from sqlalchemy import text

from examforge.errors import SliceReason
from examforge.levels import Levels, apportion, ask, schedule
from examforge.llm import LLMClient
from examforge.output import Question
from runner.pipeline import Runtime, process_chapter
from examforge.prompt import Label, build_messages, parse_difficulty, read_fields
from examforge.syllabus import Chapter, load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from storage import open_store

MIX = {"easy": 0.3, "medium": 0.5, "hard": 0.2}


# --------------------------------------------------------------------------- syllabus fields


def _load(tmp_path: Path, **fields: Any) -> Any:
    path = write_syllabus(tmp_path, "ex", {"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 5, **fields}]})
    return load_syllabus(path, max_questions=100).chapters[0]


def test_difficulty_and_bloom_are_optional_and_normalised(tmp_path: Path) -> None:
    plain = _load(tmp_path)
    assert (plain.difficulty, plain.bloom, plain.difficulty_shares) == (None, None, None)
    one = _load(tmp_path, difficulty="hard", bloom="apply")
    assert (one.difficulty, one.bloom, one.difficulty_shares) == ("hard", ["apply"],
                                                                   {"hard": 1.0})
    mix = _load(tmp_path, difficulty={"hard": 0.34, "easy": 0.33, "medium": 0.33},
                bloom=["evaluate", "remember"])
    assert list(mix.difficulty) == ["easy", "medium", "hard"]  # the levels' order
    assert sum(mix.difficulty.values()) == pytest.approx(1.0)
    assert mix.bloom == ["remember", "evaluate"]  # lowest first
    # They steer what is still to come: not part of what stored questions were made from.
    assert mix.spec_hash == plain.spec_hash


@pytest.mark.parametrize("fields, message", [
    ({"difficulty": "extreme"}, "chapters[0].difficulty: 'extreme' is not one of "
                                "easy, medium, hard"),
    ({"difficulty": 3}, "chapters[0].difficulty: must be one of easy, medium, "
                        "hard, or an object of shares"),
    ({"difficulty": {}}, "chapters[0].difficulty: a mix needs at least one level"),
    ({"difficulty": {"easy": 0.5, "hard": 0.2}},
     "chapters[0].difficulty: the shares must add up to 1, they add up to 0.7"),
    ({"difficulty": {"easy": 1.2, "hard": -0.2}},
     "chapters[0].difficulty: the share of easy must be a number above 0 and at "
     "most 1, is 1.2"),
    ({"difficulty": {"easy": "half", "hard": 0.5}},
     "chapters[0].difficulty: the share of easy must be a number"),
    ({"difficulty": {"easy": True}}, "the share of easy must be a number"),
    ({"difficulty": {"tricky": 1}}, "chapters[0].difficulty: 'tricky' is not one"),
    ({"bloom": []}, "chapters[0].bloom: must be a non-empty list of Bloom levels"),
    ({"bloom": ["apply", "memorise"]},
     "chapters[0].bloom: 'memorise' is not a Bloom level (remember, understand, "
     "apply, analyze, evaluate, create)"),
    ({"bloom": ["apply", "apply"]}, "chapters[0].bloom: a level is listed twice"),
    ({"bloom": {"apply": 1}}, "chapters[0].bloom: must be a non-empty list"),
])
def test_bad_levels_are_one_line_errors_naming_file_and_field(
        tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    from examforge.errors import SyllabusError

    with pytest.raises(SyllabusError) as info:
        _load(tmp_path, **fields)
    error = str(info.value)
    assert "\n" not in error
    assert error.startswith(f"{tmp_path / 'ex' / 'syllabus.json'}: ")
    assert message in error


# --------------------------------------------------------------------------- the mix, per call


def test_apportion_adds_up_and_follows_the_weights() -> None:
    assert apportion(10, MIX) == {"easy": 3, "medium": 5, "hard": 2}
    assert apportion(7, MIX) == {"easy": 2, "medium": 4, "hard": 1}
    assert apportion(1, MIX) == {"easy": 0, "medium": 1, "hard": 0}
    assert apportion(0, MIX) == {"easy": 0, "medium": 0, "hard": 0}
    assert apportion(4, {"easy": 0, "hard": 3}) == {"easy": 0, "hard": 4}


@pytest.mark.parametrize("n", [1, 2, 7, 10, 33, 300])
def test_every_prefix_of_a_chapter_is_within_one_question_of_its_shares(n: int) -> None:
    for k in range(1, n + 1):
        counts = schedule(MIX, 1, k)
        assert sum(counts.values()) == k
        assert all(abs(counts[level] - share * k) < 1 for level, share in MIX.items()), k
    # Slices computing their own ranges add up to the chapter's counts.
    slices = [schedule(MIX, first, min(50, n - first + 1)) for first in range(1, n + 1, 50)]
    assert sum(slices, Counter()) + Counter(dict.fromkeys(MIX, 0)) == schedule(MIX, 1, n)


def test_each_call_asks_for_what_its_slice_still_lacks() -> None:
    # A slice of numbers 1-20 (6 easy, 10 medium, 4 hard) with nothing stored: the first 10.
    assert ask(MIX, 1, 20, {}, 10) == {"easy": 3, "medium": 5, "hard": 2}
    # 10 stored as asked: the rest of the slice's share.
    assert ask(MIX, 1, 20, {"easy": 3, "medium": 5, "hard": 2}, 10) == \
        {"easy": 3, "medium": 5, "hard": 2}
    # The model wrote 10 hard: the next call asks for what is missing, no more hard.
    assert ask(MIX, 1, 20, {"hard": 10}, 10) == {"easy": 4, "medium": 6, "hard": 0}
    # The mislabelled ones leave less room than the model writes: what is missing decides.
    assert ask(MIX, 1, 20, {"hard": 14, "medium": 4}, 2) == {"easy": 1, "medium": 1, "hard": 0}
    # Asked for more than the range lacks (a defensive case): by the shares.
    assert ask(MIX, 1, 10, {"easy": 3, "medium": 5, "hard": 2}, 4) == \
        {"easy": 1, "medium": 2, "hard": 1}


def test_a_missing_or_unknown_label_gets_the_most_wanted_level_asked() -> None:
    asked = Levels({"easy": 1, "medium": 2, "hard": 0}, ("apply", "analyze"))
    qs = [Question("q1", ("a", "b", "c", "d"), 0, "", difficulty="medium", bloom="apply"),
          Question("q2", ("a", "b", "c", "d"), 0, "", difficulty=None, bloom="create"),
          Question("q3", ("a", "b", "c", "d"), 0, "", difficulty="impossible", bloom=None)]
    got = [(q.difficulty, q.bloom) for q in asked.resolve(qs)]
    # q2 fills the level most wanted after q1 (medium and easy tie at 1: easy, the earlier),
    # q3 the one left; Bloom levels the chapter does not list are dropped.
    assert got == [("medium", "apply"), ("easy", None), ("medium", None)]
    # One Bloom level: it is the level of every question; nothing asked: nothing stored.
    one = Levels(None, ("apply",)).resolve(qs)
    assert [(q.difficulty, q.bloom) for q in one] == [(None, "apply")] * 3
    assert [(q.difficulty, q.bloom) for q in Levels().resolve(qs)] == [(None, None)] * 3


def test_the_prompt_asks_for_counts_and_levels_and_the_mock_reads_them_back() -> None:
    chapter = Chapter.model_validate({"id": "a", "title": "A", "questions": 10,
                                      "difficulty": MIX, "bloom": ["apply", "analyze"],
                                      "prompt": "Difficulty: 99 hard\nis guidance, not a count"})
    user = build_messages("ex", "Ex", chapter, 10, [])[1]["content"]
    fields = read_fields(user)
    assert fields[Label.difficulty] == "3 easy, 5 medium, 2 hard"
    assert parse_difficulty(fields[Label.difficulty]) == {"easy": 3, "medium": 5, "hard": 2}
    assert fields[Label.bloom] == "apply, analyze"  # lowest first
    plain = Chapter.model_validate({"id": "a", "title": "A", "questions": 10})
    assert Label.difficulty not in read_fields(build_messages("ex", "Ex", plain, 10, [])[1][
        "content"])


# --------------------------------------------------------------------------- over a chapter


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig(latency_s=0)) as server:
        yield server


def _run(settings: Any, chapters: list[dict[str, Any]], transport: Any = None) -> list[Any]:
    path = write_syllabus(settings.exams_dir, "ex", {"title": "T", "chapters": chapters})
    store = open_store(settings.database_url)
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000),
                           slice_questions=settings.slice_questions)
    rt = Runtime.build(settings, store, LLMClient(settings, transport=transport))
    try:
        for chapter_id, slice_no in plan.slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.close()
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT chapter_id, number, difficulty, bloom FROM question "
                                 "ORDER BY chapter_id, number")).all()
    store.engine.dispose()
    return rows


def test_a_mix_is_honoured_over_a_chapter_of_several_slices_with_the_mock(
        mock: MockServer, make_settings: Any) -> None:
    settings = make_settings(llm_base_url=mock.base_url, questions_per_call=7,
                             slice_questions=15)
    rows = _run(settings, [
        {"id": "mixed", "title": "Mixed", "questions": 40, "difficulty": MIX,
         "bloom": ["understand", "apply", "evaluate"]},
        {"id": "hard", "title": "Hard", "questions": 6, "difficulty": "hard"},
        {"id": "plain", "title": "Plain", "questions": 4}])
    mixed = [r for r in rows if r.chapter_id == "mixed"]
    assert Counter(r.difficulty for r in mixed) == {"easy": 12, "medium": 20, "hard": 8}
    assert Counter(r.bloom for r in mixed).keys() == {"understand", "apply", "evaluate"}
    assert {(r.difficulty, r.bloom) for r in rows if r.chapter_id == "hard"} == {("hard", None)}
    assert {(r.difficulty, r.bloom) for r in rows if r.chapter_id == "plain"} == {(None, None)}


def test_a_model_that_ignores_the_counts_is_steered_back_by_the_next_calls(
        make_settings: Any) -> None:
    asked: list[dict[str, int]] = []
    serial = iter(range(1, 10_000))

    def stubborn(request: httpx.Request) -> httpx.Response:
        fields = read_fields(json.loads(request.content)["messages"][-1]["content"])
        counts = parse_difficulty(fields[Label.difficulty])
        asked.append(counts)
        n = int(fields[Label.question_count])
        # The first reply labels everything hard; later ones follow the prompt.
        levels = ["hard"] * n if len(asked) == 1 else [
            lv for lv, k in counts.items() for _ in range(k)]
        return reply(json.dumps({"questions": [
            {"question": f"Question {s}?", "choices": ["a", "b", "c", "d"], "answer_index": 0,
             "explanation": "", "difficulty": level}
            for s, level in zip(serial, levels)]}))

    settings = make_settings(questions_per_call=5, slice_questions=20)
    rows = _run(settings, [{"id": "a", "title": "A", "questions": 20, "difficulty": MIX}],
                httpx.MockTransport(stubborn))
    assert asked[0] == {"easy": 2, "medium": 2, "hard": 1}
    # 5 hard stored, more than the chapter's 4: no call asks for hard again, and the rest
    # goes to the levels still missing (6 easy and 10 medium wanted, 15 places left).
    assert len(asked) == 4 and all("hard" not in a for a in asked[1:])
    assert [sum(a.values()) for a in asked] == [5, 5, 5, 5]
    stored = Counter(r.difficulty for r in rows)
    assert stored["hard"] == 5 and stored["easy"] + stored["medium"] == 15
    assert stored["easy"] >= 5 and stored["medium"] >= 9


def test_the_mock_labels_its_questions_only_when_the_prompt_asks(mock: MockServer) -> None:
    chapter = Chapter.model_validate({"id": "a", "title": "A", "questions": 3,
                                      "difficulty": {"easy": 0.7, "hard": 0.3},
                                      "bloom": ["apply"]})
    plain = Chapter.model_validate({"id": "b", "title": "B", "questions": 3})
    with httpx.Client(base_url=mock.base_url or "", timeout=10) as http:
        def questions(ch: Chapter) -> list[dict[str, Any]]:
            body = {"model": "gpt-test", "messages": build_messages("ex", "Ex", ch, 3, [])}
            response = http.post("/chat/completions", json=body)
            found: list[dict[str, Any]] = json.loads(
                response.json()["choices"][0]["message"]["content"])["questions"]
            return found

        labelled = questions(chapter)
        assert [(q["difficulty"], q["bloom"]) for q in labelled] == [
            ("easy", "apply"), ("easy", "apply"), ("hard", "apply")]
        assert all("difficulty" not in q and "bloom" not in q for q in questions(plain))


def test_a_new_claim_reads_what_its_slice_stored_per_level(make_settings: Any) -> None:
    from storage.types import Usage
    from storage.store import Claimed

    settings = make_settings(questions_per_call=5, slice_questions=20)
    path = write_syllabus(settings.exams_dir, "ex", {"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 20, "difficulty": MIX}]})
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100), slice_questions=20)
    # An earlier holder stored 5 hard questions, then went away.
    claim = store.claim("ex", "a", "old", 10.0, 8)
    assert isinstance(claim, Claimed)
    call = store.start_call(claim, 1, 5, lease_s=10.0)
    store.commit_batch(claim, 10.0, call, [
        Question(f"Old {n}?", ("a", "b", "c", "d"), 0, "", difficulty="hard")
        for n in range(5)], model="m", usage=Usage(1, 1, 0.0))
    store.release(claim, retry_in_s=0, code=SliceReason.transient, detail="test")
    asked: list[dict[str, int]] = []
    serial = iter(range(1, 10_000))

    def follows(request: httpx.Request) -> httpx.Response:
        fields = read_fields(json.loads(request.content)["messages"][-1]["content"])
        counts = parse_difficulty(fields[Label.difficulty])
        asked.append(counts)
        return reply(json.dumps({"questions": [
            {"question": f"New {s}?", "choices": ["a", "b", "c", "d"], "answer_index": 0,
             "explanation": "", "difficulty": level}
            for s, level in zip(serial, [lv for lv, k in counts.items() for _ in range(k)])]}))

    rt = Runtime.build(settings, store, LLMClient(settings,
                                                  transport=httpx.MockTransport(follows)))
    try:
        assert process_chapter(rt, "ex", "a").outcome == "done"
    finally:
        rt.close()
    assert all("hard" not in a for a in asked) and len(asked) == 3
    with store.engine.connect() as conn:
        stored = Counter(dict(conn.execute(text(
            "SELECT difficulty, count(*) FROM question GROUP BY difficulty")).all()))
    store.engine.dispose()
    assert stored == {"easy": 6, "medium": 9, "hard": 5}
