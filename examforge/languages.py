"""The languages an exam can be written in: one entry each, the only list of them.

A syllabus names its language by a BCP 47 tag (`language: fa`), for the exam and per chapter
(examforge.syllabus). The tag is recorded on the exam and on its chapters' slices at enqueue
(migration 0031), so every worker writes in the exam's language whatever its environment.
What code needs of a language lives here:
- its English name, which the prompts use ("Persian (fa)": examforge.prompt, examforge.verify);
- how a choice refers to the others by position or letter in it ("all of the above", "both A
  and B", "option C"), which validation refuses (examforge.output.positional_reason): the
  choices are reordered when stored (examforge.balance), and no reorder keeps such a choice
  true. A letter counts only after a choice's name ("option B", "گزینه الف") or beside
  another ("A and B", "أ و ب"), and a cased one in capitals only ("a or b" is ordinary prose).

How a near-duplicate signature reads a language (its letter folding, stemmer, stop words,
lead-ins and number words) is examforge.neardup_lang's, one entry per tag here (a test holds
the two lists equal). Adding a language is adding an entry: its tag is then known to the syllabus, the prompts and
validation at once (tests/unit/test_languages.py holds every entry to having each part).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property

DEFAULT_LANGUAGE = "en"
# The known languages written right to left (the review page reads it from the browser's
# Intl.Locale; the bank exports from here).
RIGHT_TO_LEFT = frozenset({"fa", "ar"})


@dataclass(frozen=True)
class Language:
    """One language an exam can be written in."""

    tag: str  # BCP 47
    name: str  # in English, as the prompts name it
    # Phrases by which a choice stands for the others ("all of the above"), as written.
    phrases: tuple[str, ...]
    # The words a choice is named by ("option", "choice"), optionally followed by a plural s
    # in English.
    choice_words: tuple[str, ...]
    # How the choices are lettered in the language (Latin A-D are always counted too).
    letters: tuple[str, ...]
    # "and", "or" between two letters ("A and B", "الف و ب").
    conjunctions: tuple[str, ...]
    # How many times an English reply's tokens a reply written in it takes, rounded up to a
    # half from what cl100k_base (the costlier of the tokenizers examforge counts with)
    # spends: the fixed max_tokens allowance per question (LLM_MAX_TOKENS_PER_QUESTION, sized
    # on English) and its cap are this times it (examforge.sizing). Measured in
    # tests/unit/test_budget_languages.py.
    reply_tokens: float = 1.0

    @property
    def rtl(self) -> bool:
        """Whether it is written right to left (what a bank's HTML says with dir="rtl")."""
        return self.tag in RIGHT_TO_LEFT

    @property
    def label(self) -> str:
        """How the prompts name it: "Persian (fa)"."""
        return f"{self.name} ({self.tag})"

    @cached_property
    def _patterns(self) -> tuple[re.Pattern[str], ...]:
        letters = "|".join(map(re.escape, sorted({*map(fold, self.letters), *"ABCD"},
                                                 key=len, reverse=True)))
        words = "|".join(re.escape(fold(w)) for w in self.choice_words)
        conj = "|".join(map(re.escape, map(fold, self.conjunctions)))
        phrases = "|".join(re.escape(fold(p)) for p in self.phrases)
        # \w is Unicode-aware: Persian, Arabic and Cyrillic letters are word characters.
        return (
            re.compile(rf"(?<!\w)(?i:{phrases})(?!\w)"),
            re.compile(rf"(?<!\w)(?i:{words})s?\s*\(?\s*(?:{letters})(?:\)|(?!\w))"),
            re.compile(rf"(?<!\w)\(?(?:{letters})\)?\s+(?i:{conj})\s+\(?(?:{letters})\)?(?!\w)"),
        )

    def positional(self, text: str) -> str | None:
        """The part of `text` that refers to choices by position or letter in this
        language ("all of the above", "option B", "A and C"), or None."""
        folded = fold(text)
        return _first(self._patterns, folded, _GATES.open(folded))

    def letter_reference(self, text: str) -> str | None:
        """The part of `text` that names a choice by its letter in this language ("گزینه
        الف", "A and C"), or None: what an explanation may not hold where the reorder
        cannot rewrite it (examforge.balance rewrites English ones)."""
        folded = fold(text)
        return _first(self._patterns[1:], folded, _GATES.open(folded)[1:])


def _first(patterns: tuple[re.Pattern[str], ...], folded: str,
           open_: tuple[bool, ...]) -> str | None:
    """The first match of `patterns` in order, trying only those whose gate is open."""
    for pattern, may in zip(patterns, open_):
        if may:
            match = pattern.search(folded)
            if match:
                return match.group(0)
    return None


# Characters that re's IGNORECASE matches to a letter of ours but str.casefold does not fold
# to it (the dotless i matches "i"; "İ" folds to two characters): a text holding one has its
# phrase and word gates left open. tests/unit/test_positional_gates.py derives the list from
# every code point.
_CASE_TRAPS = ("\u0131", "\u0130")


@dataclass(frozen=True)
class _Gates:
    """Necessary conditions for a Language's three patterns, shared by every language: a
    text that fails a gate cannot match its pattern, whatever the language, so the pattern
    is not run. Why by hand: each pattern starts with a lookbehind and is case-insensitive,
    which leaves re's search to try every position (about 1.5 µs per pattern on a
    90-character choice, 30 µs for the twelve, and 13-19 % of a worker's CPU a chapter);
    the gates are substring tests and two case-sensitive scans that skip to a letter, and
    nearly every choice fails them all. tests/unit/test_positional_gates.py checks that the
    gated and ungated answers agree, on the languages' own phrases and on generated
    texts."""

    # over a casefolded text: the first two words of any phrase; any choice word
    phrase: re.Pattern[str]
    word: re.Pattern[str]
    letter: re.Pattern[str]  # a letter of any language standing alone (patterns 2 and 3)
    pair: re.Pattern[str]  # two of them one word apart ("A or B": pattern 3)

    @classmethod
    def of(cls, languages: "tuple[Language, ...]") -> "_Gates":
        letters = sorted({fold(x) for lang in languages for x in (*lang.letters, *"ABCD")},
                         key=len, reverse=True)
        one = "|".join(map(re.escape, letters))
        keys = {" ".join(fold(p).casefold().split()[:2]) for lang in languages
                for p in lang.phrases}
        words = {fold(w).casefold() for lang in languages for w in lang.choice_words}
        return cls(
            phrase=_any_of(keys), word=_any_of(words),
            # After fold the only whitespace left is a single space, which is what the
            # patterns' \s+ then match; a conjunction has no space in it.
            letter=re.compile(rf"(?:{one})(?!\w)"),
            pair=re.compile(rf"(?:{one})\)? \S+ \(?(?:{one})(?!\w)"))

    def open(self, folded: str) -> tuple[bool, bool, bool]:
        """Which of the three patterns may match `folded` (a fold()ed text)."""
        caseless = None if any(trap in folded for trap in _CASE_TRAPS) else folded.casefold()
        phrases = caseless is None or self.phrase.search(caseless) is not None
        letter = self.letter.search(folded) is not None
        words = letter and (caseless is None or self.word.search(caseless) is not None)
        pair = letter and self.pair.search(folded) is not None
        return phrases, words, pair


def _any_of(strings: set[str]) -> re.Pattern[str]:
    """A case-sensitive search for any of `strings`, leaving out those that hold another
    (a text holding the longer holds the shorter)."""
    kept = sorted(s for s in strings if not any(o != s and o in s for o in strings))
    return re.compile("|".join(map(re.escape, kept)))


# What matching compares, never what is stored: NFKC; the zero-width non-joiner Persian puts
# inside words (همه‌ی) read as a space; the Arabic yeh and kaf as Persian writes them; Arabic
# diacritics and the tatweel dropped; the alef forms as the bare alef; ё as е.
_FOLD: dict[int, str | None] = {
    **{ord(a): b for a, b in (("\u200c", " "), ("\u064a", "\u06cc"), ("\u0649", "\u06cc"),
                              ("\u0643", "\u06a9"), ("\u0623", "\u0627"), ("\u0625", "\u0627"),
                              ("\u0622", "\u0627"), ("\u0671", "\u0627"), ("ё", "е"),
                              ("Ё", "Е"))},
    **{cp: None for cp in (0x0640, 0x0670, *range(0x064B, 0x0660))}}


def fold(text: str) -> str:
    """`text` as positional phrases are matched: see _FOLD; spaces collapsed."""
    if not text.isascii():  # ASCII is its own NFKC and holds nothing _FOLD maps
        text = unicodedata.normalize("NFKC", text).translate(_FOLD)
    return " ".join(text.split())


LANGUAGES: dict[str, Language] = {lang.tag: lang for lang in (
    Language(
        "en", "English",
        # "all of the above", "neither of these", "none of the previous", ...
        phrases=tuple(f"{which} of {the}{what}" for which in ("all", "none", "both", "neither")
                      for the in ("", "the ") for what in ("above", "below", "these", "those",
                                                          "the previous")),
        choice_words=("option", "choice", "answer"), letters=("A", "B", "C", "D"),
        conjunctions=("and", "or", "&", "nor")),
    Language(
        "fa", "Persian",
        phrases=("همه موارد", "همه‌ی موارد", "همه ی موارد", "همه گزینه‌ها", "همه گزینه ها",
                 "همه‌ی گزینه‌ها", "تمام موارد", "تمامی موارد", "همه موارد فوق",
                 "همه موارد بالا", "هیچکدام", "هیچ‌کدام", "هیچ کدام", "هیچیک", "هیچ‌یک",
                 "هیچ یک", "هیچکدام از موارد", "هر دو مورد", "هر دو گزینه", "موارد بالا",
                 "موارد فوق", "گزینه‌های بالا", "گزینه های بالا"),
        choice_words=("گزینه", "گزینه‌ی", "گزینه ی", "گزینه‌های", "گزینه های", "مورد"),
        letters=("الف", "ب", "ج", "د"),
        conjunctions=("و", "یا"), reply_tokens=3.5),
    Language(
        "ar", "Arabic",
        phrases=("جميع ما سبق", "كل ما سبق", "جميع ما ذكر", "كل ما ذكر", "جميع ما تقدم",
                 "جميع الإجابات", "كل الإجابات", "جميع الخيارات", "كل الخيارات",
                 "لا شيء مما سبق", "لا شيء مما ذكر", "لا شيء مما تقدم", "لا شيء مما سبق ذكره",
                 "ليس أيا مما سبق", "ليس أيًا مما سبق", "لا أحد مما سبق", "ولا واحد مما سبق",
                 "لا شيء من الإجابات", "كلا الخيارين"),
        choice_words=("الخيار", "خيار", "الاختيار", "الإجابة", "إجابة", "البديل"),
        letters=("أ", "ب", "ج", "د"),
        conjunctions=("و", "أو"), reply_tokens=3.0),
    Language(
        "ru", "Russian",
        phrases=("все вышеперечисленное", "всё вышеперечисленное", "все вышеперечисленные",
                 "все перечисленное", "все перечисленные", "все ответы верны",
                 "все варианты верны", "все указанные", "все выше", "ничего из вышеперечисленного",
                 "ничего из перечисленного", "ни один из вышеперечисленных",
                 "ни одно из вышеперечисленных", "ни один из перечисленных",
                 "ни один из вариантов", "ни один из ответов", "нет верного ответа",
                 "оба варианта", "оба ответа"),
        choice_words=("вариант", "варианты", "ответ", "ответы", "пункт"),
        letters=("А", "Б", "В", "Г"),
        conjunctions=("и", "или", "&"), reply_tokens=2.5),
)}
_GATES = _Gates.of(tuple(LANGUAGES.values()))


def positional_in_any(text: str) -> bool:
    """Whether `text` refers to choices by position or letter in any language examforge
    knows (folded and gated once for all of them): what keeps an imported question's
    order."""
    folded = fold(text)
    open_ = _GATES.open(folded)
    return any(open_) and any(_first(lang._patterns, folded, open_)
                              for lang in LANGUAGES.values())


def known_tags() -> tuple[str, ...]:
    """The tags a syllabus may name, sorted."""
    return tuple(sorted(LANGUAGES))


def language(tag: str | None) -> Language:
    """The language of a recorded tag (None: the default). Raises KeyError for an unknown one:
    a syllabus never gets one past its check."""
    return LANGUAGES[tag or DEFAULT_LANGUAGE]


def check_tag(value: object) -> str:
    """A syllabus's `language`: one of the known tags, or ValueError naming them all."""
    if not isinstance(value, str) or value not in LANGUAGES:
        raise ValueError(f"{value!r} is not a language examforge knows; known tags: "
                         f"{', '.join(known_tags())}")
    return value
