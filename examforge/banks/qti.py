"""QTI 1.2 for Canvas: a zip Canvas imports under Settings > Import course content.

The package has text2qti's layout and item structure, which Canvas is known to import:

    imsmanifest.xml
    non_cc_assessments/
    <assessment id>/assessment_meta.xml      Canvas quiz settings
    <assessment id>/<assessment id>.xml      the questestinterop

One assessment (a Canvas quiz) per exam; in its root section, one section per chapter that is
a Canvas question group picking all of its questions (text2qti's GROUP), titled with the
chapter, so a teacher can lower the pick count per chapter. One `multiple_choice_question`
item per question: the choices as `response_label`s, the right one scored 100, the
explanation as general feedback (`general_fb`, shown whatever the answer).

Why not text2qti itself: it reads its own Markdown-based text, so every question would need
escaping into that syntax (and Markdown would reinterpret `*`, `_`, backticks and raw HTML in
model text); it builds the whole quiz in memory; and its identifiers are hashes of content,
whereas ours come from the question's identity, so that "Overwrite assessment content with
matching IDs" on a re-import can update the same quiz and questions.

Streaming: the assessment is written into the zip as questions arrive, but a group's size
must precede its items, so each chapter's items wait in a spooled temporary file (memory up
to `_SPOOL_BYTES`, then disk) until the chapter ends. assessment_meta.xml, which holds the
total points, is written last.

Text is `as_html` inside XML-escaped `mattext texttype="text/html"`, as text2qti does (a
chapter in another language than English: its `xml:lang`, and the HTML inside
`<div lang dir>`, examforge.banks.text.in_language). Canvas
Classic Quizzes have no tags: they are kept as `examforge_tag` item metadata fields, which
Canvas ignores. Shuffle: the quiz's "Shuffle answers" is off (the stored order is already
balanced); it is one setting in Canvas to turn on.
"""

from __future__ import annotations

import datetime
import shutil
import tempfile
import zipfile
from typing import IO, BinaryIO, Iterable
from xml.sax.saxutils import escape, quoteattr

from examforge.banks.model import BankChapter, BankExam, BankQuestion, checked
from examforge.banks.text import as_html, in_language, question_name

SHUFFLE_ANSWERS = False
POINTS_PER_QUESTION = 1
_SPOOL_BYTES = 8 << 20


class _Ids:
    """Identifiers derived from the exam slug, chapter id and number only: stable across
    exports. Slugs and chapter ids are [a-z0-9-], so `_` separates them unambiguously."""

    def __init__(self, exam: BankExam) -> None:
        base = f"examforge_{exam.slug}"
        self.manifest = f"{base}_manifest"
        self.assessment = f"{base}_assessment"
        self.dependency = f"{base}_dependency"
        self.assignment = f"{base}_assignment"
        self.assignment_group = f"{base}_assignment-group"
        self._base = base

    def section(self, chapter: BankChapter) -> str:
        return f"{self._base}_{chapter.id}"

    def question(self, q: BankQuestion) -> str:
        return f"{self._base}_{q.chapter_id}_{q.number}"

    def choice(self, q: BankQuestion, index: int) -> str:
        return f"{self.question(q)}_choice{index + 1}"


_MANIFEST = """\
<?xml version="1.0" encoding="UTF-8"?>
<manifest identifier="{manifest}" xmlns="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1" \
xmlns:lom="http://ltsc.ieee.org/xsd/imsccv1p1/LOM/resource" \
xmlns:imsmd="http://www.imsglobal.org/xsd/imsmd_v1p2" \
xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" \
xsi:schemaLocation="http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1 \
http://www.imsglobal.org/xsd/imscp_v1p1.xsd http://ltsc.ieee.org/xsd/imsccv1p1/LOM/resource \
http://www.imsglobal.org/profile/cc/ccv1p1/LOM/ccv1p1_lomresource_v1p0.xsd \
http://www.imsglobal.org/xsd/imsmd_v1p2 http://www.imsglobal.org/xsd/imsmd_v1p2p2.xsd">
  <metadata>
    <schema>IMS Content</schema>
    <schemaversion>1.1.3</schemaversion>
    <imsmd:lom>
      <imsmd:general>
        <imsmd:title>
          <imsmd:string>{title}</imsmd:string>
        </imsmd:title>
      </imsmd:general>
      <imsmd:lifeCycle>
        <imsmd:contribute>
          <imsmd:date>
            <imsmd:dateTime>{date}</imsmd:dateTime>
          </imsmd:date>
        </imsmd:contribute>
      </imsmd:lifeCycle>
    </imsmd:lom>
  </metadata>
  <organizations/>
  <resources>
    <resource identifier="{assessment}" type="imsqti_xmlv1p2">
      <file href="{assessment}/{assessment}.xml"/>
      <dependency identifierref="{dependency}"/>
    </resource>
    <resource identifier="{dependency}" \
type="associatedcontent/imscc_xmlv1p1/learning-application-resource" \
href="{assessment}/assessment_meta.xml">
      <file href="{assessment}/assessment_meta.xml"/>
    </resource>
  </resources>
</manifest>
"""

# text2qti's assessment_meta.xml: the Canvas quiz settings, unpublished on import.
_META = """\
<?xml version="1.0" encoding="UTF-8"?>
<quiz identifier="{assessment}" xmlns="http://canvas.instructure.com/xsd/cccv1p0" \
xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" \
xsi:schemaLocation="http://canvas.instructure.com/xsd/cccv1p0 \
https://canvas.instructure.com/xsd/cccv1p0.xsd">
  <title>{title}</title>
  <description></description>
  <shuffle_answers>{shuffle}</shuffle_answers>
  <scoring_policy>keep_highest</scoring_policy>
  <hide_results></hide_results>
  <quiz_type>assignment</quiz_type>
  <points_possible>{points:.1f}</points_possible>
  <require_lockdown_browser>false</require_lockdown_browser>
  <require_lockdown_browser_for_results>false</require_lockdown_browser_for_results>
  <require_lockdown_browser_monitor>false</require_lockdown_browser_monitor>
  <lockdown_browser_monitor_data/>
  <show_correct_answers>true</show_correct_answers>
  <anonymous_submissions>false</anonymous_submissions>
  <could_be_locked>false</could_be_locked>
  <allowed_attempts>1</allowed_attempts>
  <one_question_at_a_time>false</one_question_at_a_time>
  <cant_go_back>false</cant_go_back>
  <available>false</available>
  <one_time_results>false</one_time_results>
  <show_correct_answers_last_attempt>false</show_correct_answers_last_attempt>
  <only_visible_to_overrides>false</only_visible_to_overrides>
  <module_locked>false</module_locked>
  <assignment identifier="{assignment}">
    <title>{title}</title>
    <due_at/>
    <lock_at/>
    <unlock_at/>
    <module_locked>false</module_locked>
    <workflow_state>unpublished</workflow_state>
    <assignment_overrides>
    </assignment_overrides>
    <quiz_identifierref>{assessment}</quiz_identifierref>
    <allowed_extensions></allowed_extensions>
    <has_group_category>false</has_group_category>
    <points_possible>{points:.1f}</points_possible>
    <grading_type>points</grading_type>
    <all_day>false</all_day>
    <submission_types>online_quiz</submission_types>
    <position>1</position>
    <turnitin_enabled>false</turnitin_enabled>
    <vericite_enabled>false</vericite_enabled>
    <peer_review_count>0</peer_review_count>
    <peer_reviews>false</peer_reviews>
    <automatic_peer_reviews>false</automatic_peer_reviews>
    <anonymous_peer_reviews>false</anonymous_peer_reviews>
    <grade_group_students_individually>false</grade_group_students_individually>
    <freeze_on_copy>false</freeze_on_copy>
    <omit_from_final_grade>false</omit_from_final_grade>
    <intra_group_peer_reviews>false</intra_group_peer_reviews>
    <only_visible_to_overrides>false</only_visible_to_overrides>
    <post_to_sis>false</post_to_sis>
    <moderated_grading>false</moderated_grading>
    <grader_count>0</grader_count>
    <grader_comments_visible_to_graders>true</grader_comments_visible_to_graders>
    <anonymous_grading>false</anonymous_grading>
    <graders_anonymous_to_graders>false</graders_anonymous_to_graders>
    <grader_names_visible_to_final_grader>true</grader_names_visible_to_final_grader>
    <anonymous_instructor_annotations>false</anonymous_instructor_annotations>
    <post_policy>
      <post_manually>false</post_manually>
    </post_policy>
  </assignment>
  <assignment_group_identifierref>{assignment_group}</assignment_group_identifierref>
  <assignment_overrides>
  </assignment_overrides>
</quiz>
"""

_ASSESSMENT_START = """\
<?xml version="1.0" encoding="UTF-8"?>
<questestinterop xmlns="http://www.imsglobal.org/xsd/ims_qtiasiv1p2" \
xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" \
xsi:schemaLocation="http://www.imsglobal.org/xsd/ims_qtiasiv1p2 \
http://www.imsglobal.org/xsd/ims_qtiasiv1p2p1.xsd">
  <assessment ident="{assessment}" title={title}>
    <qtimetadata>
      <qtimetadatafield>
        <fieldlabel>cc_maxattempts</fieldlabel>
        <fieldentry>1</fieldentry>
      </qtimetadatafield>
    </qtimetadata>
    <section ident="root_section">
"""

_ASSESSMENT_END = """\
    </section>
  </assessment>
</questestinterop>
"""

_SECTION_START = """\
    <section ident="{ident}" title={title}>
      <selection_ordering>
        <selection>
          <selection_number>{pick}</selection_number>
          <selection_extension>
            <points_per_item>{points}</points_per_item>
          </selection_extension>
        </selection>
      </selection_ordering>
"""

_SECTION_END = "    </section>\n"


def _field(label: str, entry: str) -> str:
    return ("            <qtimetadatafield>\n"
            f"              <fieldlabel>{escape(label)}</fieldlabel>\n"
            f"              <fieldentry>{escape(entry)}</fieldentry>\n"
            "            </qtimetadatafield>\n")


def _mattext(text: str, language: str = "en") -> str:
    if language == "en":
        return f'<mattext texttype="text/html">{escape(as_html(text))}</mattext>'
    # QTI 1.2's mattext takes xml:lang; Canvas reads the HTML's lang and dir.
    return (f'<mattext texttype="text/html" xml:lang={quoteattr(language)}>'
            f'{escape(in_language(as_html(text), language))}</mattext>')


def _item(ids: _Ids, q: BankQuestion, language: str = "en") -> str:
    qid = ids.question(q)
    choice_ids, texts = _labels(ids, q)
    parts = [
        f"      <item ident={quoteattr(qid)} "
        f"title={quoteattr(question_name(q.chapter_id, q.number))}>\n",
        "        <itemmetadata>\n          <qtimetadata>\n",
        _field("question_type", QUESTION_TYPES[q.type]),
        _field("points_possible", str(POINTS_PER_QUESTION)),
        _field("original_answer_ids", ",".join(choice_ids)),
        _field("assessment_question_identifierref", f"{qid}_ref"),
        *(_field("examforge_tag", tag) for tag in q.tags),
        "          </qtimetadata>\n        </itemmetadata>\n",
        "        <presentation>\n",
        f"          <material>\n            {_mattext(q.question, language)}\n          </material>\n",
        '          <response_lid ident="response1" rcardinality="Single">\n',
        "            <render_choice>\n",
    ]
    if q.type == "multi":  # every right choice to pick: a response of many
        parts[-2] = parts[-2].replace('"Single"', '"Multiple"')
    for cid, choice in zip(choice_ids, texts):
        parts.append(
            f"              <response_label ident={quoteattr(cid)}>\n"
            "                <material>\n"
            f"                  {_mattext(choice, language)}\n"
            "                </material>\n"
            "              </response_label>\n")
    if q.type in _FILL_IN:  # no choices: a fill-in or numeric response in their place
        del parts[-2:]
    parts += [
        _FILL_IN[q.type] + "        </presentation>\n" if q.type in _FILL_IN else
        "            </render_choice>\n          </response_lid>\n        </presentation>\n",
        "        <resprocessing>\n          <outcomes>\n"
        '            <decvar maxvalue="100" minvalue="0" varname="SCORE" vartype="Decimal"/>\n'
        "          </outcomes>\n",
    ]
    if q.feedback:
        parts.append(
            '          <respcondition continue="Yes">\n'
            "            <conditionvar>\n              <other/>\n            </conditionvar>\n"
            '            <displayfeedback feedbacktype="Response" linkrefid="general_fb"/>\n'
            "          </respcondition>\n")
    for condition in _conditions(q, choice_ids):  # what scores 100, as the type says
        parts.append(
            '          <respcondition continue="No">\n'
            "            <conditionvar>\n"
            f"              {condition}\n"
            "            </conditionvar>\n"
            '            <setvar action="Set" varname="SCORE">100</setvar>\n'
            "          </respcondition>\n")
    parts.append("        </resprocessing>\n")
    if q.feedback:
        parts.append(
            '        <itemfeedback ident="general_fb">\n'
            "          <flow_mat>\n            <material>\n"
            f"              {_mattext(q.feedback, language)}\n"  # the explanation, the source
            "            </material>\n          </flow_mat>\n"
            "        </itemfeedback>\n")
    parts.append("      </item>\n")
    return "".join(parts)


# Each item type's Canvas question type (examforge.item_types), as text2qti writes them.
QUESTION_TYPES = {"mcq": "multiple_choice_question", "multi": "multiple_answers_question",
                  "truefalse": "true_false_question", "short": "short_answer_question",
                  "numeric": "numerical_question"}


def _labels(ids: _Ids, q: BankQuestion) -> tuple[list[str], list[str]]:
    """The response labels' identifiers and texts: the choices, or True and False."""
    texts = list(q.choices) if q.type in ("mcq", "multi") else (
        ["True", "False"] if q.type == "truefalse" else [])
    return [ids.choice(q, i) for i in range(len(texts))], texts


# A fill-in or numeric response (text2qti's), in place of a choice's: short and numeric items.
_FILL_IN = {kind: ('          <response_str ident="response1" rcardinality="Single">\n'
                   f"            <render_fib{fib}>\n"
                   f'              <response_label ident="answer1"{label}/>\n'
                   "            </render_fib>\n          </response_str>\n")
            for kind, fib, label in (("short", "", ' rshuffle="No"'),
                                     ("numeric", ' fibtype="Decimal"', ""))}


def _conditions(q: BankQuestion, choice_ids: list[str]) -> list[str]:
    """The conditionvar contents of the respcondition that scores 100, as text2qti writes
    them: a choice, a set of choices (every right one picked, no wrong one), any of the
    accepted answers, or the number within its tolerance (an absolute range, as Canvas
    keeps it)."""
    eq = '<varequal respident="response1">{}</varequal>'
    if q.type == "mcq":
        return [eq.format(choice_ids[q.answer_index])]
    if q.type == "truefalse":
        return [eq.format(choice_ids[0 if q.answer["value"] else 1])]
    if q.type == "multi":
        right = set(q.correct)
        terms = [eq.format(cid) if i in right else f"<not>{eq.format(cid)}</not>"
                 for i, cid in enumerate(choice_ids)]
        return ["<and>" + "".join(terms) + "</and>"]
    if q.type == "short":
        return ["".join(eq.format(escape(a)) for a in q.answer["accepted"])]
    from examforge.banks.moodle_xml import number
    from examforge.item_types import absolute_tolerance

    value, tolerance = float(q.answer["value"]), absolute_tolerance(q.answer)
    return ["<or>" + eq.format(number(value)) + "<and>"
            f'<vargte respident="response1">{number(value - tolerance)}</vargte>'
            f'<varlte respident="response1">{number(value + tolerance)}</varlte>'
            "</and></or>"]


class _Group:
    """One chapter's items, spooled until its size (the group's pick count) is known."""

    def __init__(self, chapter: BankChapter) -> None:
        self.chapter = chapter
        self.count = 0
        self._spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)

    def add(self, item: str) -> None:
        self._spool.write(item.encode("utf-8"))
        self.count += 1

    def flush(self, ids: _Ids, sink: IO[bytes]) -> None:
        sink.write(_SECTION_START.format(
            ident=ids.section(self.chapter), title=quoteattr(self.chapter.title),
            pick=self.count, points=POINTS_PER_QUESTION).encode("utf-8"))
        self._spool.seek(0)
        shutil.copyfileobj(self._spool, sink)
        sink.write(_SECTION_END.encode("utf-8"))
        self.close()

    def close(self) -> None:
        self._spool.close()


def write(exam: BankExam, questions: Iterable[BankQuestion], out: BinaryIO) -> int:
    """Write the bank as a Canvas QTI 1.2 zip, streaming one chapter at a time."""
    ids = _Ids(exam)
    names = {"assessment": ids.assessment, "dependency": ids.dependency,
             "manifest": ids.manifest, "assignment": ids.assignment,
             "assignment_group": ids.assignment_group}
    total = 0
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("imsmanifest.xml", _MANIFEST.format(
            title=escape(exam.title), date=datetime.date.today().isoformat(), **names))
        zf.writestr(zipfile.ZipInfo("non_cc_assessments/"), b"")
        with zf.open(f"{ids.assessment}/{ids.assessment}.xml", "w") as sink:
            sink.write(_ASSESSMENT_START.format(
                assessment=ids.assessment, title=quoteattr(exam.title)).encode("utf-8"))
            group: _Group | None = None
            try:
                for chapter, q in checked(exam, questions):
                    if group is None or group.chapter is not chapter:
                        if group is not None:
                            group.flush(ids, sink)
                        group = _Group(chapter)
                    group.add(_item(ids, q, chapter.language))
                    total += 1
                if group is not None:
                    group.flush(ids, sink)
            finally:
                if group is not None:
                    group.close()
            sink.write(_ASSESSMENT_END.encode("utf-8"))
        zf.writestr(f"{ids.assessment}/assessment_meta.xml", _META.format(
            title=escape(exam.title), shuffle="true" if SHUFFLE_ANSWERS else "false",
            points=float(total * POINTS_PER_QUESTION), **names))
    return total
