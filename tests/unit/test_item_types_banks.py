"""Every item type (issue 32) in every export: the bank formats' native forms, read back
exactly by the readers the bank tests use (ElementTree as Moodle's qformat_xml reads Moodle
XML, the strict GIFT reader of test_banks_gift, Anki's own library, and text2qti's structure
for QTI; text2qti has every type, so no type is left to a structural check alone), and the
table formats' `type` and answer fields, which `import` reads back."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from bank_samples import strict_unhtml

from examforge.banks import BankChapter, BankExam, BankQuestion, write_bank
from producer.export import bank_questions, render

EXAM = BankExam("ex", "Exam", (BankChapter("a", "Mixed: {types}", 0),))
HOSTILE = "a ~ b = c # d { e } f : g * h <b>i</b> \\ j ‘ق’"
QUESTIONS = [
    BankQuestion("a", 1, "Which ports? " + HOSTILE, ("22", "80 " + HOSTILE, "443", "8080", "21"),
                 -1, "Because " + HOSTILE, ("difficulty:easy",), type="multi",
                 answer={"correct": [0, 2, 4]}),
    BankQuestion("a", 2, "HTTPS uses port 443. " + HOSTILE, (), -1, "", type="truefalse",
                 answer={"value": True}),
    BankQuestion("a", 3, "Telnet is secure.", (), -1, "No.", type="truefalse",
                 answer={"value": False}),
    BankQuestion("a", 4, "The capital of France?", (), -1, "Paris.", type="short",
                 answer={"accepted": ["Paris", "Paris " + HOSTILE]}),
    BankQuestion("a", 5, "Uptime of 99.95 %, in minutes a month?", (), -1, "", type="numeric",
                 answer={"value": 21.9, "tolerance": 0.5, "relative": False, "unit": "min"}),
    BankQuestion("a", 6, "Half of -3?", (), -1, "", type="numeric",
                 answer={"value": -1.5, "tolerance": 0.1, "relative": True, "unit": None}),
    BankQuestion("a", 7, "Plain?", ("w", "x", "y", "z"), 2, "mcq"),
]


def _bank(fmt: str, questions: list[BankQuestion] = QUESTIONS) -> bytes:
    out = io.BytesIO()
    assert write_bank(fmt, EXAM, iter(questions), out) == len(questions)
    return out.getvalue()


# --------------------------------------------------------------------------- Moodle XML


def _moodle(element: ET.Element) -> dict[str, Any]:
    """A question as Moodle's qformat_xml imports it (import_multichoice, import_truefalse,
    import_shortanswer, import_numerical)."""
    kind = element.get("type")
    answers = element.findall("answer")
    out: dict[str, Any] = {"type": kind,
                           "question": strict_unhtml(element.findtext("questiontext/text") or "")}
    if kind == "multichoice":
        out["single"] = element.findtext("single")
        out["choices"] = [strict_unhtml(a.findtext("text") or "") for a in answers]
        out["fractions"] = [float(a.get("fraction") or "") for a in answers]
    elif kind == "truefalse":
        # Moodle: the answer whose text is "true" is the true one; its fraction says which.
        out["value"] = next(float(a.get("fraction") or 0) == 100 for a in answers
                            if a.findtext("text") == "true")
        assert sorted(a.findtext("text") for a in answers) == ["false", "true"]
    elif kind == "shortanswer":
        assert element.findtext("usecase") == "0"
        assert all(a.get("fraction") == "100" for a in answers)
        # Moodle's shortanswer reads `\*` as a star, `*` as a wildcard.
        out["accepted"] = [(a.findtext("text") or "").replace("\\*", "*") for a in answers]
    else:
        assert kind == "numerical" and len(answers) == 1
        out["value"] = float(answers[0].findtext("text") or "")
        out["tolerance"] = float(answers[0].findtext("tolerance") or "")
        out["units"] = [u.findtext("unit_name") for u in element.findall("units/unit")]
    return out


def test_moodle_xml_has_each_types_native_form() -> None:
    root = ET.fromstring(_bank("moodle-xml"))
    read = [_moodle(q) for q in root if q.get("type") != "category"]
    multi, true, false, short, num, half, mcq = read
    assert multi["single"] == "false" and multi["choices"][1] == "80 " + HOSTILE
    # The correct choices share 100 %, the wrong ones -100 %: Moodle's own fractions.
    assert multi["fractions"] == pytest.approx([33.33333, -50, 33.33333, -50, 33.33333])
    assert sum(f for f in multi["fractions"] if f > 0) == pytest.approx(100, abs=1e-3)
    assert (true["type"], true["value"], false["value"]) == ("truefalse", True, False)
    assert short["accepted"] == ["Paris", "Paris " + HOSTILE]
    assert (num["value"], num["tolerance"], num["units"]) == (21.9, 0.5, ["min"])
    # A relative tolerance becomes Moodle's absolute one.
    assert (half["value"], half["tolerance"], half["units"]) == (-1.5, 0.15, [])
    assert mcq["single"] == "true" and mcq["fractions"] == [0, 0, 100, 0]


# --------------------------------------------------------------------------- GIFT


def _gift_blocks(data: bytes) -> list[dict[str, Any]]:
    """Each question block, its answers read by the strict cursor of test_banks_gift:
    Moodle's qformat_gift decides the type from the answers' marks."""
    from test_banks_gift import Cursor, rich

    out = []
    for block in data.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith("//")]
        if not lines or lines[0].startswith("$CATEGORY"):
            continue
        c = Cursor("\n".join(lines))
        c.expect("::")
        c.read("::")
        c.expect("::")
        question = rich(c.read("{"))
        c.expect("{")
        answers = []
        while True:
            c.expect("\n\t")
            if c.at("####"):
                c.expect("####")
                rich(c.read("\n"))
                c.expect("\n}")
                break
            end = c.text.index("\n", c.i)  # the raw line: its mark and weight, then its text
            answers.append(c.text[c.i:end])
            c.i = end
            if c.at("\n}"):
                c.expect("\n}")
                break
        out.append({"question": question, "answers": answers})
    return out


def _text(raw: str, rich: bool = True) -> str:
    """An answer's text, unescaped by the strict cursor (every special character escaped)."""
    from test_banks_gift import Cursor, rich as unrich

    c = Cursor(raw + "\n")
    text = c.read("\n")
    return unrich(text) if rich else text


def test_gift_has_each_types_native_form() -> None:
    blocks = _gift_blocks(_bank("gift"))
    multi, true, false, short, num, half, mcq = blocks
    weights = [a.split("%")[1] for a in multi["answers"]]
    assert weights == ["33.33333", "-50", "33.33333", "-50", "33.33333"]
    assert [_text(a.split("%", 2)[2]) for a in multi["answers"]] == list(QUESTIONS[0].choices)
    assert (true["answers"], false["answers"]) == (["T"], ["F"])
    # Short answers: all `=`, each with an explicit weight, plain text; `\*` is Moodle's
    # literal star in a short answer.
    assert [_text(a.removeprefix("=%100%"), rich=False).replace("\\*", "*")
            for a in short["answers"]] == ["Paris", "Paris " + HOSTILE]
    assert num["answers"] == ["#21.9:0.5"] and half["answers"] == ["#-1.5:0.15"]
    assert [a[0] for a in mcq["answers"]] == ["~", "~", "=", "~"]


# --------------------------------------------------------------------------- QTI


TEXT2QTI_TYPES = """\
Quiz title: Demo

GROUP
pick: 4
points per question: 1

Title: a-0001
1.  Which?
... Because.
[*] 22
[ ] 80
[*] 443
[ ] 8080

Title: a-0002
2.  HTTPS uses port 443.
*a) True
b)  False

Title: a-0003
3.  The capital?
*   Paris
*   paris, fr

Title: a-0004
4.  Uptime?
=   21.9 +- 0.5

END_GROUP
"""

QTI_OURS = [
    BankQuestion("a", 1, "Which?", ("22", "80", "443", "8080"), -1, "Because.", type="multi",
                 answer={"correct": [0, 2]}),
    BankQuestion("a", 2, "HTTPS uses port 443.", (), -1, "", type="truefalse",
                 answer={"value": True}),
    BankQuestion("a", 3, "The capital?", (), -1, "", type="short",
                 answer={"accepted": ["Paris", "paris, fr"]}),
    BankQuestion("a", 4, "Uptime?", (), -1, "", type="numeric",
                 answer={"value": 21.9, "tolerance": 0.5, "relative": False, "unit": "min"}),
]


def test_qti_has_text2qtis_structure_for_every_type() -> None:
    from test_banks_qti import open_package, skeleton
    from text2qti.config import Config
    from text2qti.qti import QTI as Text2qti
    from text2qti.quiz import Quiz

    theirs = open_package(Text2qti(Quiz(TEXT2QTI_TYPES, config=Config())).zip_bytes())
    exam = BankExam("ex", "Demo", (BankChapter("a", "A", 1),))
    out = io.BytesIO()
    write_bank("qti", exam, iter(QTI_OURS), out)
    ours = open_package(out.getvalue())
    # The same elements, attributes and question types as text2qti's, item by item.
    assert skeleton(ours.assessment) == skeleton(theirs.assessment)


def test_qti_scores_each_types_answer() -> None:
    from test_banks_qti import QTI, open_package

    package = open_package(_bank("qti"))
    items = list(package.assessment.iter(f"{QTI}item"))
    kinds = [next(f.findtext(f"{QTI}fieldentry") for f in i.iter(f"{QTI}qtimetadatafield")
                  if f.findtext(f"{QTI}fieldlabel") == "question_type") for i in items]
    assert kinds == ["multiple_answers_question", "true_false_question", "true_false_question",
                     "short_answer_question", "numerical_question", "numerical_question",
                     "multiple_choice_question"]

    def scored(item: ET.Element) -> ET.Element:
        [condition] = [r for r in item.iter(f"{QTI}respcondition")
                       if r.find(f"{QTI}setvar") is not None]
        found = condition.find(f"{QTI}conditionvar")
        assert found is not None
        return found

    labels = [[lab.get("ident") for lab in i.iter(f"{QTI}response_label")] for i in items]
    multi = scored(items[0]).find(f"{QTI}and")
    assert multi is not None
    right = [e.text for e in multi.findall(f"{QTI}varequal")]
    wrong = [e.text for e in multi.findall(f"{QTI}not/{QTI}varequal")]
    assert (right, wrong) == ([labels[0][i] for i in (0, 2, 4)], [labels[0][i] for i in (1, 3)])
    assert [scored(items[k]).findtext(f"{QTI}varequal") for k in (1, 2)] == [
        labels[1][0], labels[2][1]]  # True, then False
    assert [e.text for e in scored(items[3]).findall(f"{QTI}varequal")] == [
        "Paris", "Paris " + HOSTILE]
    bounds = scored(items[4]).find(f"{QTI}or/{QTI}and")
    assert bounds is not None
    assert (bounds.findtext(f"{QTI}vargte"), bounds.findtext(f"{QTI}varlte")) == ("21.4", "22.4")


# --------------------------------------------------------------------------- Anki


def test_anki_reads_back_each_types_card(tmp_path: Any) -> None:
    from anki import import_export_pb2
    from anki.collection import Collection

    path = tmp_path / "bank.apkg"
    path.write_bytes(_bank("anki"))
    col = Collection(str(tmp_path / "collection.anki2"))
    try:
        request = import_export_pb2.ImportAnkiPackageRequest(
            package_path=str(path), options=import_export_pb2.ImportAnkiPackageOptions())
        assert len(col.import_anki_package(request).log.new) == len(QUESTIONS)
        backs = {}
        for nid in col.find_notes(""):
            note = col.get_note(nid)
            fields = dict(zip(note.keys(), note.fields))
            backs[strict_unhtml(fields["Question"])] = fields
    finally:
        col.close()
    by_type = {q.type: backs[q.question] for q in reversed(QUESTIONS)}
    assert strict_unhtml(by_type["multi"]["Answer"]) == f"A. 22; C. 443; E. 21"
    assert by_type["multi"]["Type"] == "Select all that apply."
    assert strict_unhtml(backs["Telnet is secure."]["Answer"]) == "False"
    assert strict_unhtml(by_type["truefalse"]["Answer"]) == "True"
    assert strict_unhtml(by_type["short"]["Answer"]) == f"Paris / Paris {HOSTILE}"
    assert strict_unhtml(backs["Uptime of 99.95 %, in minutes a month?"]["Answer"]) == (
        "21.9 min (± 0.5 min)")
    assert strict_unhtml(backs["Half of -3?"]["Answer"]) == "-1.5 (± 0.15)"
    assert by_type["mcq"]["Answer"] == "C"  # the four-choice note type, as before


# --------------------------------------------------------------------------- tables


ROWS = [{"exam": "ex", "chapter_id": "a", "number": q.number, "question": q.question,
         "choices": list(q.choices), "answer_index": q.answer_index,
         "explanation": q.explanation, "difficulty": None, "bloom": None, "source": None,
         "verdict": None, "model": "m", "created_at": 0, "type": q.type,
         **__import__("examforge.item_types", fromlist=["x"]).reply_fields(q.type, q.answer)}
        for q in QUESTIONS]


def test_jsonl_json_and_csv_carry_the_type_and_its_answer_fields() -> None:
    from examforge.output import check_item

    lines = [json.loads(line) for line in render(ROWS, "jsonl").splitlines()]
    assert [r["type"] for r in lines] == [q.type for q in QUESTIONS]
    assert lines[0]["correct"] == [0, 2, 4] and lines[1]["answer"] is True
    assert lines[3]["accepted"][0] == "Paris" and lines[4]["unit"] == "min"
    assert json.loads(render(ROWS, "json")) == lines
    # What `import` reads (examforge.output.check_item) is what was exported.
    for line, q in zip(lines, QUESTIONS):
        item = check_item(line)
        assert (item.type, item.question, item.choices) == (q.type, q.question, q.choices)
        assert json.loads(item.answer or "null") == (q.answer or None)
    import csv

    table = list(csv.DictReader(io.StringIO(render(ROWS, "csv"))))
    assert [r["type"] for r in table] == [q.type for q in QUESTIONS]
    assert json.loads(table[0]["answer"]) == {"choices": list(QUESTIONS[0].choices),
                                              "correct": [0, 2, 4]}
    assert json.loads(table[1]["answer"]) == {"answer": True}
    assert table[6]["answer"] == "" and table[6]["choice_c"] == "y"
    assert [q.answer for q in bank_questions(ROWS)] == [q.answer for q in QUESTIONS]
