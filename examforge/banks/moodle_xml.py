"""Moodle XML (`<quiz>`), the most complete format Moodle imports.

Layout: one `category` pseudo-question per chapter (`$course$/top/<exam>/<chapter>`, emitted
when the chapter's first question arrives), then one `multichoice` question per stored
question. Moodle reads the category from the file when "Get category from file" is ticked
(the default), creating the path if needed.

Escaping, in two layers:
- Rich text (question, choices, explanation) is `as_html` (format="html", what Moodle's own
  export uses) inside CDATA. `as_html` escapes `>`, so `]]>` cannot occur, but `cdata` splits
  it anyway rather than rely on that.
- Plain fields (name, category path, tags) are XML-escaped. Category names escape `/` as `//`,
  as Moodle's own `assemble_category_path` does.

Language: Moodle XML has no field for a question's language (a question's is the course's).
A chapter in another language than English has its question, choices and feedback as
`<div lang="fa" dir="rtl">...</div>` (examforge.banks.text.in_language): Moodle shows them in
that language and direction. (Not Moodle's multilang spans: with the multi-language filter
on, those hide text from users whose language is another.)

Shuffle: `<shuffleanswers>true</shuffleanswers>`. Moodle shuffles a question's answers only
when both the question and the quiz ("Shuffle within questions") say so; with the question
at true, a teacher keeps or drops shuffling for a whole quiz with that one setting, whereas
false would lock every question to the stored order (already balanced by the exporter) and
could only be undone question by question. The quiz setting defaults to Yes.
"""

from __future__ import annotations

from typing import BinaryIO, Iterable
from xml.sax.saxutils import escape

from examforge.banks.model import BankChapter, BankExam, BankQuestion, checked
from examforge.banks.text import as_html, in_language, one_line, question_name

SHUFFLE_ANSWERS = True


def cdata(text: str) -> str:
    """`text` as CDATA sections; a `]]>` inside is split across two of them."""
    return "<![CDATA[" + text.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def category_path(exam: BankExam, chapter: BankChapter) -> str:
    """`$course$/top/<exam title>/<chapter title>`, each name escaped like Moodle does."""
    names = [one_line(exam.title), one_line(chapter.title)]
    escaped = []
    for name in names:
        name = name.replace("/", "//")
        # A name starting or ending with "/" would merge with the separator: Moodle pads it.
        if name.startswith("/"):
            name = " " + name
        if name.endswith("/"):
            name = name + " "
        escaped.append(name)
    return "/".join(["$course$", "top", *escaped])


def _category(exam: BankExam, chapter: BankChapter) -> str:
    return (
        '  <question type="category">\n'
        f"    <category><text>{escape(category_path(exam, chapter))}</text></category>\n"
        '    <info format="html"><text></text></info>\n'
        "  </question>\n"
    )


def _rich(tag: str, text: str, indent: str = "    ", language: str = "en") -> str:
    html = in_language(as_html(text), language)
    return f'{indent}<{tag} format="html"><text>{cdata(html)}</text></{tag}>\n'


def _question(q: BankQuestion, language: str = "en") -> str:
    parts = [
        f'  <question type="{QUESTION_TYPES[q.type]}">\n',
        f"    <name><text>{escape(question_name(q.chapter_id, q.number))}</text></name>\n",
        _rich("questiontext", q.question, language=language),
        _rich("generalfeedback", q.feedback, language=language),  # explanation, then source
        "    <defaultgrade>1</defaultgrade>\n",
    ]
    if q.type in ("truefalse", "short", "numeric"):
        parts.extend(_answers(q))
        return "".join(parts + _tags(q) + ["  </question>\n"])
    parts += [
        f"    <single>{'true' if q.type == 'mcq' else 'false'}</single>\n",
        f"    <shuffleanswers>{'true' if SHUFFLE_ANSWERS else 'false'}</shuffleanswers>\n",
        "    <answernumbering>abc</answernumbering>\n",
    ]
    for choice, fraction in zip(q.choices, fractions(q)):
        parts.append(
            f'    <answer fraction="{fraction}" format="html">\n'
            f"      <text>{cdata(in_language(as_html(choice), language))}</text>\n"
            '      <feedback format="html"><text></text></feedback>\n'
            "    </answer>\n"
        )
    parts.extend(_tags(q))
    parts.append("  </question>\n")
    return "".join(parts)


def _tags(q: BankQuestion) -> list[str]:
    if not q.tags:
        return []
    return ["    <tags>\n", *(f"      <tag><text>{escape(tag)}</text></tag>\n" for tag in q.tags),
            "    </tags>\n"]


# Each item type's Moodle question type (examforge.item_types).
QUESTION_TYPES = {"mcq": "multichoice", "multi": "multichoice", "truefalse": "truefalse",
                  "short": "shortanswer", "numeric": "numerical"}
# The grades Moodle accepts for an answer (question_bank::fraction_options_full), as it
# writes them: a multi's correct choices share 100 % and its wrong ones -100 %, each to the
# nearest of these (2 to 5 correct, 1 to 4 wrong: all exact).
_FRACTIONS = {1: "100", 2: "50", 3: "33.33333", 4: "25", 5: "20"}


def fractions(q: BankQuestion) -> list[str]:
    """The grade of each choice of an mcq or a multi (Moodle's `fraction`, in %)."""
    correct = set(q.correct)
    if q.type == "mcq":
        return ["100" if i in correct else "0" for i in range(len(q.choices))]
    wrong = len(q.choices) - len(correct)
    return [_FRACTIONS[len(correct)] if i in correct else "-" + _FRACTIONS[wrong]
            for i in range(len(q.choices))]


def number(value: float) -> str:
    """A number as Moodle reads it (no exponent, no trailing zeros)."""
    text = f"{value:.10f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _answers(q: BankQuestion) -> list[str]:
    """The answer elements of an item of another type than mcq."""
    parts = []
    if q.type == "truefalse":
        for word in ("true", "false"):
            right = (word == "true") is q.answer["value"]
            parts.append(f'    <answer fraction="{100 if right else 0}" format="moodle_auto_format">\n'
                         f"      <text>{word}</text>\n"
                         '      <feedback format="html"><text></text></feedback>\n'
                         "    </answer>\n")
    elif q.type == "short":
        parts.append("    <usecase>0</usecase>\n")  # case does not count (as examforge's check)
        for accepted in q.answer["accepted"]:
            parts.append('    <answer fraction="100" format="moodle_auto_format">\n'
                         # `*` is Moodle's wildcard in a short answer: `\*` is a star.
                         f"      <text>{escape(accepted.replace('*', chr(92) + '*'))}</text>\n"
                         '      <feedback format="html"><text></text></feedback>\n'
                         "    </answer>\n")
    else:  # numeric: Moodle's tolerance is absolute (a relative one is converted)
        from examforge.item_types import absolute_tolerance

        parts.append('    <answer fraction="100" format="moodle_auto_format">\n'
                     f"      <text>{number(q.answer['value'])}</text>\n"
                     f"      <tolerance>{number(absolute_tolerance(q.answer))}</tolerance>\n"
                     '      <feedback format="html"><text></text></feedback>\n'
                     "    </answer>\n")
        if q.answer.get("unit"):
            parts.append("    <units>\n      <unit>\n        <multiplier>1</multiplier>\n"
                         f"        <unit_name>{escape(q.answer['unit'])}</unit_name>\n"
                         "      </unit>\n    </units>\n"
                         # The unit is shown and optional: a bare number is graded too.
                         "    <unitgradingtype>0</unitgradingtype>\n"
                         "    <showunits>3</showunits>\n    <unitsleft>0</unitsleft>\n")
    return parts


def write(exam: BankExam, questions: Iterable[BankQuestion], out: BinaryIO) -> int:
    """Stream the bank as Moodle XML: one question in memory at a time."""
    out.write(b'<?xml version="1.0" encoding="UTF-8"?>\n<quiz>\n')
    count = 0
    current: BankChapter | None = None
    for chapter, q in checked(exam, questions):
        if chapter is not current:
            out.write(_category(exam, chapter).encode("utf-8"))
            current = chapter
        out.write(_question(q, chapter.language).encode("utf-8"))
        count += 1
    out.write(b"</quiz>\n")
    return count
