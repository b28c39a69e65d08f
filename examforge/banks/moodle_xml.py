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
        '  <question type="multichoice">\n',
        f"    <name><text>{escape(question_name(q.chapter_id, q.number))}</text></name>\n",
        _rich("questiontext", q.question, language=language),
        _rich("generalfeedback", q.feedback, language=language),  # explanation, then source
        "    <defaultgrade>1</defaultgrade>\n",
        "    <single>true</single>\n",
        f"    <shuffleanswers>{'true' if SHUFFLE_ANSWERS else 'false'}</shuffleanswers>\n",
        "    <answernumbering>abc</answernumbering>\n",
    ]
    for index, choice in enumerate(q.choices):
        fraction = 100 if index == q.answer_index else 0
        parts.append(
            f'    <answer fraction="{fraction}" format="html">\n'
            f"      <text>{cdata(in_language(as_html(choice), language))}</text>\n"
            '      <feedback format="html"><text></text></feedback>\n'
            "    </answer>\n"
        )
    if q.tags:
        parts.append("    <tags>\n")
        parts.extend(f"      <tag><text>{escape(tag)}</text></tag>\n" for tag in q.tags)
        parts.append("    </tags>\n")
    parts.append("  </question>\n")
    return "".join(parts)


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
