"""QTI 1.2 for Canvas: read back with zipfile and ElementTree, and compare its structure
with what text2qti (which Canvas imports) produces for the same kind of quiz."""

from __future__ import annotations

import dataclasses
import io
import xml.etree.ElementTree as ET
import zipfile

from bank_samples import hostile_exam, hostile_questions, normalised, strict_unhtml

from examforge.banks import BankChapter, BankExam, BankQuestion, write_bank

QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
CP = "{http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1}"
CANVAS = "{http://canvas.instructure.com/xsd/cccv1p0}"


@dataclasses.dataclass
class Package:
    names: list[str]
    manifest: ET.Element
    assessment: ET.Element
    meta: ET.Element


def open_package(data: bytes) -> Package:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        manifest = ET.fromstring(zf.read("imsmanifest.xml"))
        # The manifest's resources name the assessment and its Canvas settings.
        hrefs = [f.get("href") for f in manifest.iter(f"{CP}file")]
        [assessment_href] = [h for h in hrefs if h and not h.endswith("assessment_meta.xml")]
        [meta_href] = [h for h in hrefs if h and h.endswith("assessment_meta.xml")]
        assessment = ET.fromstring(zf.read(assessment_href))
        meta = ET.fromstring(zf.read(meta_href))
    return Package(names, manifest, assessment, meta)


def _assessment(package: Package) -> ET.Element:
    element = package.assessment.find(f"{QTI}assessment")
    assert element is not None
    return element


def _mattext(element: ET.Element) -> str:
    mattext = element.find(f"{QTI}material/{QTI}mattext")
    if mattext is None:
        mattext = element.find(f"{QTI}flow_mat/{QTI}material/{QTI}mattext")
    assert mattext is not None and mattext.get("texttype") == "text/html"
    return strict_unhtml(mattext.text or "")


def read_item(item: ET.Element) -> dict[str, object]:
    fields = [(f.findtext(f"{QTI}fieldlabel"), f.findtext(f"{QTI}fieldentry") or "")
              for f in item.iter(f"{QTI}qtimetadatafield")]
    assert ("question_type", "multiple_choice_question") in fields
    presentation = item.find(f"{QTI}presentation")
    assert presentation is not None
    labels = presentation.findall(f"{QTI}response_lid/{QTI}render_choice/{QTI}response_label")
    label_ids = [label.get("ident") for label in labels]
    scored = [c for c in item.iter(f"{QTI}respcondition")
              if c.find(f"{QTI}setvar") is not None]
    assert len(scored) == 1 and scored[0].findtext(f"{QTI}setvar") == "100"
    right = scored[0].findtext(f"{QTI}conditionvar/{QTI}varequal")
    feedback = item.find(f"{QTI}itemfeedback[@ident='general_fb']")
    shown = [d.get("linkrefid") for d in item.iter(f"{QTI}displayfeedback")]
    assert shown == (["general_fb"] if feedback is not None else [])
    return {
        "title": item.get("title"),
        "question": _mattext(presentation),
        "choices": tuple(_mattext(label) for label in labels),
        "answer_index": label_ids.index(right),
        "explanation": _mattext(feedback) if feedback is not None else "",
        "tags": tuple(entry for label, entry in fields if label == "examforge_tag"),
    }


def read_bank(data: bytes) -> tuple[Package, list[tuple[str, dict[str, object]]]]:
    """(section title, item) for every item, in file order."""
    package = open_package(data)
    [root_section] = package.assessment.findall(f"{QTI}assessment/{QTI}section")
    assert root_section.get("ident") == "root_section"
    out = []
    for section in root_section:
        assert section.tag == f"{QTI}section"
        items = section.findall(f"{QTI}item")
        # A Canvas question group that picks all of its questions.
        assert section.findtext(f"{QTI}selection_ordering/{QTI}selection/"
                                f"{QTI}selection_number") == str(len(items))
        out.extend((section.get("title") or "", read_item(item)) for item in items)
    return package, out


def _export(exam: BankExam, questions: list[BankQuestion]) -> bytes:
    out = io.BytesIO()
    assert write_bank("qti", exam, iter(questions), out) == len(questions)
    return out.getvalue()


def test_every_question_choice_answer_explanation_and_tag_round_trips():
    exam, questions = hostile_exam(), hostile_questions()
    package, read = read_bank(_export(exam, questions))
    assert len(read) == len(questions)
    titles = {c.id: c.title for c in exam.chapters}
    for (section, got), q in zip(read, questions):
        assert section == titles[q.chapter_id]
        assert got == {
            "title": f"{q.chapter_id}-{q.number:04d}",
            "question": normalised(q.question),
            "choices": tuple(normalised(c) for c in q.choices),
            "answer_index": q.answer_index,
            "explanation": normalised(q.explanation),
            "tags": q.tags,
        }
    assert _assessment(package).get("title") == exam.title
    assert package.meta.findtext(f"{CANVAS}title") == exam.title
    assert package.meta.findtext(f"{CANVAS}points_possible") == f"{len(questions):.1f}"
    assert package.meta.findtext(f"{CANVAS}shuffle_answers") == "false"


def _idents(data: bytes) -> list[str]:
    package = open_package(data)
    return [e.get("ident") or "" for e in package.assessment.iter()
            if e.tag in (f"{QTI}item", f"{QTI}response_label", f"{QTI}section")]


def test_identifiers_are_the_same_across_exports_and_differ_between_questions():
    exam, questions = hostile_exam(), hostile_questions()
    first = _idents(_export(exam, questions))
    edited = [dataclasses.replace(q, question=q.question + " (edited)") for q in questions]
    assert _idents(_export(exam, edited)) == first
    assert len(set(first)) == len(first)


# What text2qti writes for a group of two multiple-choice questions, one with general
# feedback: the same structure as ours, up to identifiers, titles and texts.
TEXT2QTI_QUIZ = """\
Quiz title: Demo

GROUP
pick: 2
points per question: 1

Title: a-0001
1.  What is 2+3?
... Because.
a)  6
*b) 5
c)  1
d)  7

Title: a-0002
2.  What is 2+4?
*a) 6
b)  5
c)  1
d)  7

END_GROUP
"""

OURS = [BankQuestion("a", 1, "What is 2+3?", ("6", "5", "1", "7"), 1, "Because."),
        BankQuestion("a", 2, "What is 2+4?", ("6", "5", "1", "7"), 0, "")]


def skeleton(element: ET.Element) -> tuple[object, ...]:
    """Tags, attribute names and the values that are not identifiers or titles, and the
    labels of metadata fields, recursively."""
    attributes = tuple(sorted((k, "*" if k in ("ident", "title", "identifier") else v)
                              for k, v in element.attrib.items()))
    text = element.text if element.tag.endswith(("fieldlabel", "setvar")) else None
    return (element.tag, attributes, text, tuple(skeleton(child) for child in element))


def test_the_package_has_text2qtis_structure():
    from text2qti.config import Config
    from text2qti.qti import QTI as Text2qti
    from text2qti.quiz import Quiz

    theirs = open_package(Text2qti(Quiz(TEXT2QTI_QUIZ, config=Config())).zip_bytes())
    ours = open_package(_export(BankExam("ex", "Demo", (BankChapter("a", "A", 1),)), OURS))

    def layout(names: list[str], package: Package) -> list[str]:
        ident = _assessment(package).get("ident") or "?"
        return sorted(n.replace(ident, "ID") for n in names)

    assert layout(ours.names, ours) == layout(theirs.names, theirs)
    assert skeleton(ours.assessment) == skeleton(theirs.assessment)
    assert [e.tag for e in ours.meta] == [e.tag for e in theirs.meta]
    manifest_resources = [(r.get("type"), len(r)) for r in ours.manifest.iter(f"{CP}resource")]
    assert manifest_resources == [(r.get("type"), len(r))
                                  for r in theirs.manifest.iter(f"{CP}resource")]
