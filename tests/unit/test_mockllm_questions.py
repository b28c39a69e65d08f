"""The mock's question texts: lexically distinct within a chapter, and paraphrases of them."""

from __future__ import annotations

import statistics

import pytest

from mockllm import questions as q
from mockllm_support import jaccard, pairwise_jaccards, shingles, words

KEY, TITLE = "aws-saa/ch-1", "EC2 basics"


def _texts(n: int = 300, key: str = KEY) -> list[str]:
    return [q.make_question(key, TITLE, serial)["question"] for serial in range(1, n + 1)]


def test_a_300_question_chapter_has_lexically_distinct_questions() -> None:
    texts = _texts()
    assert len(set(texts)) == 300
    scores = pairwise_jaccards(texts, k=3)
    # Word 3-shingles: two questions share at most one of their five word groups.
    assert max(scores) < 0.3, max(scores)
    assert statistics.mean(scores) < 0.06
    assert statistics.mean(pairwise_jaccards(texts, k=2)) < 0.12


def test_every_question_is_well_formed() -> None:
    for serial in range(1, 200):
        question = q.make_question(KEY, TITLE, serial)
        assert TITLE in question["question"] and question["question"].endswith("?")
        choices = question["choices"]
        assert len(choices) == 4 and len(set(choices)) == 4
        assert choices[question["answer_index"]] in q.GOOD_PRACTICES
        assert sum(choice in q.GOOD_PRACTICES for choice in choices) == 1
        assert question["explanation"].startswith(choices[question["answer_index"]])


def test_questions_are_a_pure_function_of_chapter_and_serial() -> None:
    assert _texts(50) == _texts(50)
    other = _texts(50, key="aws-saa/ch-2")
    assert not set(other) & set(_texts(50))
    assert max(pairwise_jaccards(_texts(20) + other[:20])) < 0.35


def test_answers_are_spread_unless_a_position_is_configured() -> None:
    spread = {q.make_question(KEY, TITLE, s)["answer_index"] for s in range(1, 9)}
    assert spread == {0, 1, 2, 3}
    for position in range(4):
        assert {q.make_question(KEY, TITLE, s, position)["answer_index"] for s in range(1, 30)} == {position}


def test_texts_stay_unique_past_one_pass_of_the_array() -> None:
    first_pass = q.P * q.P
    texts = _texts(first_pass + 60)
    assert len(set(texts)) == len(texts)
    assert texts[first_pass].endswith("(part 2)")


@pytest.mark.parametrize("variant", range(8))
def test_a_rewording_keeps_meaning_and_answer_but_not_wording(variant: int) -> None:
    texts = _texts()
    vocab = [set(words(t)) for t in texts]
    for serial in range(1, 301):
        original = q.make_question(KEY, TITLE, serial)
        paraphrase = q.reword(KEY, TITLE, serial, variant)
        assert paraphrase["choices"] == original["choices"]
        assert paraphrase["answer_index"] == original["answer_index"]
        text = paraphrase["question"]
        assert text != original["question"] and TITLE in text
        assert not text.startswith(original["question"].rstrip("?"))  # a rewording, not a suffix
        # Reworded, not the same words: a light repeat may change a single phrase ("Which" to
        # "What"), as models do.
        assert jaccard(shingles(text), shingles(original["question"])) < 0.95
        # Still about the same thing: nearer its original than any other question of the chapter.
        mine = set(words(text))
        nearest = max(range(300), key=lambda i: jaccard(mine, vocab[i]))
        assert nearest == serial - 1


def test_rewordings_use_several_transformations() -> None:
    serial = next(s for s in range(1, 100) if q.has_qualifier(q.slots_for(KEY, s)))
    slots = q.slots_for(KEY, serial)
    original = q.make_question(KEY, TITLE, serial)["question"]
    paraphrases = [q.reword(KEY, TITLE, serial, variant)["question"] for variant in range(40)]
    assert len(set(paraphrases)) >= 15  # the changes are drawn: some paraphrases coincide

    def asks_what(text: str) -> bool:
        return " what " in f" {text.lower()}" and " which " not in f" {text.lower()}"

    def scenario_first(text: str) -> bool:
        return any(text.lower().startswith(s.lower()) for pair in q.SCENARIOS for s in pair)

    concept, synonym = q.CONCEPTS[slots.concept]
    qualifier, other_qualifier = q.QUALIFIERS[slots.qualifier]
    assert concept in original
    assert any(asks_what(p) != asks_what(original) for p in paraphrases)  # Which ... / What ...
    assert any(scenario_first(p) != scenario_first(original) for p in paraphrases)  # clause moved
    assert any(synonym in p for p in paraphrases)  # synonyms
    assert any(f" {other_qualifier} " in p for p in paraphrases)  # another qualifier
    assert f" {qualifier} " in original


def test_rewordings_write_numbers_another_way() -> None:
    serial = next(s for s in range(1, 300) if q.has_numbers(q.slots_for(KEY, s)))
    original = q.make_question(KEY, TITLE, serial)["question"]
    paraphrases = [q.reword(KEY, TITLE, serial, variant)["question"] for variant in range(40)]
    digits = {w for w in words(original) if w.isdigit()}
    assert digits and any(not digits <= set(words(p)) or " percent" in p for p in paraphrases)
    assert q.respell_numbers("12,000 requests, 7 days, 50% of 250ms") == \
        "12000 requests, seven days, 50 percent of 250 ms"
