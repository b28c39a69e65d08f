"""The gates in front of the positional patterns (examforge.languages._Gates): a pattern is
skipped only where it cannot match, so every answer is the one the twelve patterns give
alone; and an ordinary choice closes every gate, which is what makes the check cheap."""

from __future__ import annotations

import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from examforge.balance import positional
from examforge.languages import _CASE_TRAPS, _GATES, LANGUAGES, _first, fold, positional_in_any
from examforge.output import Question

ALL_OPEN = (True, True, True)


def _ungated(lang, text: str) -> str | None:
    return _first(lang._patterns, fold(text), ALL_OPEN)


def _ungated_letters(lang, text: str) -> str | None:
    return _first(lang._patterns[1:], fold(text), ALL_OPEN)


def _agree(text: str) -> None:
    for lang in LANGUAGES.values():
        assert lang.positional(text) == _ungated(lang, text), (lang.tag, text)
        assert lang.letter_reference(text) == _ungated_letters(lang, text), (lang.tag, text)
    assert positional_in_any(text) == any(_ungated(lang, text) for lang in LANGUAGES.values())


def _pieces() -> list[str]:
    """What the patterns are made of, in every language, with case and script traps."""
    out: list[str] = []
    for lang in LANGUAGES.values():
        out += [*lang.phrases, *lang.choice_words, *lang.letters, *lang.conjunctions]
        out += [p.upper() for p in lang.phrases[:3]] + [w.title() for w in lang.choice_words]
    return out + [*"ABCDabcd", "(", ")", " ", "  ", "\u200c", "s", ".", ",", "x", "word",
                  "\u0131", "\u0130", "\u017f", "\u212a", "\u1c80", "ALL", "Of", "NONE"]


def test_the_languages_own_phrases_words_and_letters_get_the_ungated_answer():
    cases = ["The mitochondria produces ATP through oxidative phosphorylation.",
             "A process that converts light energy", "Paris", "All of the above",
             "ALL OF THE ABOVE", "Both A and C", "option (B)", "answerA", "A or B",
             "a or b", "(A) & (B)", "nei\u0131ther of these", "NE\u0130THER of these",
             "\u1c80се вышеперечисленное", "گزینه الف", "الف و ب", "همه‌ی موارد",
             "ни один из вариантов", "ВСЕ ВЫШЕПЕРЕЧИСЛЕННОЕ", "Вариант Б", "А и В"]
    for lang in LANGUAGES.values():
        cases += list(lang.phrases)
        cases += [f"{w} {x}" for w in lang.choice_words for x in (*lang.letters, "A")]
        cases += [f"{a} {c} {b}" for a, b in zip(lang.letters, lang.letters[1:])
                  for c in lang.conjunctions]
    for text in cases:
        _agree(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_pieces()), max_size=8))
def test_generated_texts_get_the_ungated_answer(parts):
    _agree(" ".join(parts))
    _agree("".join(parts))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_pieces()), max_size=4).map(" ".join),
                min_size=2, max_size=4))
def test_a_question_s_choices_checked_as_one_text_get_each_choice_s_answer(choices):
    """examforge.balance.positional joins them with a NUL: nothing matches across it."""
    q = Question("Q?", tuple(choices), 0, "")
    assert positional(q) == any(positional_in_any(c) for c in choices), choices


def test_an_ordinary_choice_closes_every_gate_and_a_positional_one_opens_its_own():
    assert _GATES.open(fold("The mitochondria produces ATP in the inner membrane.")) == (
        False, False, False)
    assert _GATES.open(fold("فرایندی که انرژی نور را ذخیره می‌کند")) == (False, False, False)
    assert _GATES.open(fold("All of the above"))[0]
    assert _GATES.open(fold("Option B")) == (False, True, False)
    assert _GATES.open(fold("A or B")) == (False, False, True)
    assert positional(Question("Q?", ("All of the above", "x", "y", "z"), 0, ""))
    assert not positional(Question("Q?", ("w", "x", "y", "z"), 0, ""))


def test_the_case_traps_are_the_characters_ignorecase_and_casefold_disagree_on():
    """Derived from every code point: a character that re's IGNORECASE matches to a letter
    of a phrase or a choice word, but that str.casefold does not fold to what it folds that
    letter to, would let the phrase or word gate close on a text the pattern matches."""
    letters = {ch for lang in LANGUAGES.values() for text in (*lang.phrases, *lang.choice_words)
               for ch in fold(text) if ch != " "}
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    near = set(re.findall("[" + "".join(map(re.escape, sorted(letters))) + "]", every,
                          re.IGNORECASE))
    traps = {c for c in near for p in letters
             if re.fullmatch(re.escape(p), c, re.IGNORECASE) and c.casefold() != p.casefold()}
    assert traps == set(_CASE_TRAPS)
