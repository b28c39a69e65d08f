"""Answer positions: balanced over the bank, fixed by each question's identity (examforge.balance).

The mock is told to put the correct answer first every time (`answer_position=0`), the worst
bias a model can have; what is stored must be uniform, and every stored question's marked
answer must still be the right one."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from examforge.balance import answer_position, balanced, positional
from examforge.llm import LLMClient
from examforge.output import Question
from runner.pipeline import Runtime, process_chapter
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from mockllm.questions import BAD_PRACTICES, GOOD_PRACTICES
from storage import open_store

# Chi-square critical value for 3 degrees of freedom at p = 0.001: a fair die over four faces
# exceeds it once in a thousand banks. The balanced scheme must sit far below it.
CHI2_3_DF_P001 = 16.27


def _chi2(counts: Counter[int]) -> float:
    total = sum(counts.values())
    return sum((counts[p] - total / 4) ** 2 / (total / 4) for p in range(4))


@pytest.mark.parametrize("n", [1, 3, 4, 7, 20, 23, 300])
def test_every_chapter_holds_each_position_n_over_4_times_within_one(n: int) -> None:
    counts = Counter(answer_position("ex", "ch", k) for k in range(1, n + 1))
    assert max(counts.values(), default=0) - min((counts[p] for p in range(4)), default=0) <= 1
    assert sum(counts.values()) == n


def test_positions_depend_on_the_identity_only_and_differ_between_chapters() -> None:
    first = [answer_position("ex", "a", k) for k in range(1, 41)]
    assert first == [answer_position("ex", "a", k) for k in range(1, 41)]
    assert first != [answer_position("ex", "b", k) for k in range(1, 41)]
    assert first != [answer_position("other", "a", k) for k in range(1, 41)]
    # Not a fixed cycle: blocks of four use different permutations.
    assert len({tuple(first[i:i + 4]) for i in range(0, 40, 4)}) > 1


def test_the_right_answer_moves_with_its_text_and_balancing_twice_changes_nothing() -> None:
    q = Question("Q?", ("right", "w1", "w2", "w3"), 0, "Because.", difficulty="easy",
                 bloom="apply")
    for number in range(1, 9):
        b = balanced(q, "ex", "ch", number)
        assert b.answer_index == answer_position("ex", "ch", number)
        assert b.choices[b.answer_index] == "right"
        assert sorted(b.choices) == sorted(q.choices)
        assert (b.question, b.explanation, b.difficulty, b.bloom) == ("Q?", "Because.", "easy",
                                                                       "apply")
        assert balanced(b, "ex", "ch", number) == b
        # Where the model put its choices does not matter: the same choices, the same order.
        shuffled = Question("Q?", ("w2", "w3", "right", "w1"), 2, "Because.", "easy", "apply")
        assert balanced(shuffled, "ex", "ch", number) == b


def test_letter_references_in_the_explanation_follow_their_choices() -> None:
    q = Question("Q?", ("right", "w1", "w2", "w3"), 0,
                 "Option A is right; options B and choice C are risky, answer (D) is not. "
                 "A plan B stays.")
    for number in range(1, 9):
        b = balanced(q, "ex", "ch", number)
        letter = "ABCD"[b.answer_index]
        new = {text: "ABCD"[i] for i, text in enumerate(b.choices)}
        assert b.explanation == (
            f"Option {letter} is right; options {new['w1']} and choice {new['w2']} are risky, "
            f"answer ({new['w3']}) is not. A plan B stays.")


@pytest.mark.parametrize("choice", ["All of the above", "None of these", "Both A and C",
                                    "Only B or D"])
def test_choices_that_point_at_positions_keep_their_order(choice: str) -> None:
    q = Question("Q?", ("w1", "w2", "w3", choice), 3, "")
    assert positional(q)
    assert all(balanced(q, "ex", "ch", n) == q for n in range(1, 5))


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig(latency_s=0, answer_position=0)) as server:
        yield server


def test_a_mock_that_always_answers_first_gives_a_uniform_bank(mock, make_settings) -> None:
    chapters = [("a", 40), ("b", 37), ("c", 23)]
    settings = make_settings(llm_base_url=mock.base_url, questions_per_call=10,
                             slice_questions=20)
    path = write_syllabus(settings.exams_dir, "ex", chapters)
    store = open_store(settings.database_url)
    plan = store.sync_exam("ex", load_syllabus(path, max_questions=1000),
                           slice_questions=settings.slice_questions)
    rt = Runtime.build(settings, store, LLMClient(settings))
    try:
        for chapter_id, slice_no in plan.slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.close()
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT chapter_id, number, choices, answer_index FROM "
                                 "question ORDER BY chapter_id, number")).all()
    store.engine.dispose()
    assert len(rows) == 100
    overall: Counter[int] = Counter()
    for chapter_id, _ in chapters:
        counts = Counter(r.answer_index for r in rows if r.chapter_id == chapter_id)
        assert max(counts.values()) - min(counts[p] for p in range(4)) <= 1, counts
        overall.update(counts)
    assert _chi2(overall) < 1.0 < CHI2_3_DF_P001, overall  # 100 over 4: 25 each, within 2
    for r in rows:
        choices = json.loads(r.choices)
        # The mock's right answer is always one of its good practices, the others bad ones:
        # the stored mark still points at the right text.
        assert choices[r.answer_index] in GOOD_PRACTICES
        assert all(c in BAD_PRACTICES for i, c in enumerate(choices) if i != r.answer_index)
        assert r.answer_index == answer_position("ex", r.chapter_id, r.number)


def test_imported_questions_are_balanced_too_and_keep_known_levels(make_settings) -> None:
    settings = make_settings()
    path = write_syllabus(settings.exams_dir, "ex", [("a", 12)])
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=100))
    first = [Question(f"Imported {n}?", (f"right {n}", "w1", "w2", "w3"), 0, "Option A.",
                      difficulty="hard" if n % 2 else "impossible", bloom="apply")
             for n in range(1, 13)]
    store.import_questions("ex", {"a": first}, "old.jsonl")
    rows = store.questions("ex")
    assert Counter(r["answer_index"] for r in rows) == {0: 3, 1: 3, 2: 3, 3: 3}
    for r in rows:
        n = r["number"]
        assert r["choices"][r["answer_index"]] == f"right {n}"
        assert r["explanation"] == f"Option {'ABCD'[r['answer_index']]}."
        # Levels of the two vocabularies are kept; others are not.
        assert (r["difficulty"], r["bloom"]) == ("hard" if n % 2 else None, "apply")
    store.engine.dispose()
