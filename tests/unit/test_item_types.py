"""Item types (issue 32): a chapter's `types` counts, through the syllabus, the prompt, the
reply's validation, the pipeline's counts per slice and the stored rows."""

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

from examforge import item_types
from examforge.errors import OutputInvalid, Rejection, SyllabusError
from examforge.levels import ask_types, lacking_types
from examforge.llm import LLMClient
from examforge.output import check_item, parse_questions
from examforge.prompt import Label, build_messages, parse_types, read_fields, types_asked
from examforge.reply_schema import reply_schema, response_format
from examforge.syllabus import Chapter, load_syllabus
from helpers import write_syllabus
from mockllm import MockConfig, MockServer
from runner.pipeline import Runtime, process_chapter
from storage import open_store

MIXED = {"mcq": 8, "multi": 3, "truefalse": 6, "short": 2, "numeric": 1}


def _load(tmp_path: Path, **fields: Any) -> Chapter:
    path = write_syllabus(tmp_path, "ex", {"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 5, **fields}]})
    return load_syllabus(path, max_questions=100).chapters[0]


# --------------------------------------------------------------------------- the syllabus


def test_types_default_to_all_mcq_and_keep_the_spec_hash(tmp_path: Path) -> None:
    plain = _load(tmp_path)
    assert plain.types is None and plain.item_types is None
    only_mcq = _load(tmp_path, types={"mcq": 5})
    assert only_mcq.item_types is None and only_mcq.spec_hash == plain.spec_hash
    mixed = _load(tmp_path, types={"truefalse": 2, "mcq": 3, "short": 0})
    assert mixed.types == {"mcq": 3, "truefalse": 2}  # the types' own order, zeros dropped
    assert mixed.spec_hash != plain.spec_hash


@pytest.mark.parametrize("types, message", [
    ({"mcq": 2, "truefalse": 2}, "chapters[0]: types: the counts add up to 4, not to "
                                 "questions (5)"),
    ({"essay": 5}, "chapters[0].types: 'essay' is not an item type (mcq, multi, truefalse, "
                   "short, numeric)"),
    ({"mcq": 4.5, "short": 0.5}, "chapters[0].types: the count of mcq must be a whole number"),
    ({"mcq": -1, "short": 6}, "chapters[0].types: the count of mcq must be a whole number"),
    ([5], "chapters[0].types: must be an object of counts per item type"),
    ({}, "chapters[0].types: must be an object of counts per item type"),
])
def test_bad_types_are_one_line_errors_naming_file_and_field(
        tmp_path: Path, types: Any, message: str) -> None:
    with pytest.raises(SyllabusError) as caught:
        _load(tmp_path, types=types)
    text_ = str(caught.value)
    assert text_.startswith(f"{tmp_path / 'ex' / 'syllabus.json'}: {message}")
    assert "\n" not in text_


# --------------------------------------------------------------------------- each call's share


def test_the_counts_spread_exactly_over_slices_and_calls() -> None:
    # Four slices of 5 numbers each: their schedules add up to the chapter's counts.
    total: Counter[str] = Counter()
    for first in (1, 6, 11, 16):
        asked, _ = ask_types(MIXED, first, 5, {}, 5)
        assert sum(asked.values()) == 5
        total.update(asked)
    assert total == MIXED
    # A slice that has stored its mcq asks for the rest only.
    stored = {"mcq": 2}
    asked, _ = ask_types(MIXED, 1, 5, stored, 3)
    assert "mcq" not in asked and sum(asked.values()) == 3
    # What it may still store; None (take anything) when its counts cannot fill it.
    assert sum((lacking_types(MIXED, 1, 5, stored) or {}).values()) == 3
    assert lacking_types(MIXED, 1, 5, {"short": 5, "mcq": 0}) is not None
    assert lacking_types({"mcq": 1, "truefalse": 1}, 1, 2, {"truefalse": 1}) == {
        "mcq": 1, "truefalse": 0}
    assert lacking_types({"mcq": 1, "truefalse": 1}, 1, 2, {"truefalse": 1, "mcq": 1}) == {
        "mcq": 0, "truefalse": 0}


def test_true_and_false_statements_are_asked_in_even_shares() -> None:
    asked, trues = ask_types({"truefalse": 4}, 1, 4, {}, 4)
    assert asked == {"truefalse": 4} and trues == 2
    # Three true stored: the next two are false.
    _, trues = ask_types({"truefalse": 6}, 1, 6, {"truefalse": 3, "truefalse:true": 3}, 2)
    assert trues == 0


def test_the_prompt_asks_for_the_calls_share_last_and_the_mock_reads_it_back() -> None:
    chapter = Chapter.model_validate({"id": "a", "title": "A", "questions": 20,
                                      "types": MIXED})
    messages = build_messages("ex", "Ex", chapter, 20, ["Old?"])
    user = messages[-1]["content"]
    lines = user.splitlines()
    assert lines[-1] == "Number of questions: 20"
    assert lines[-2].startswith("Item types: 8 mcq, 3 multi, 6 truefalse (3 true, 3 false)")
    assert read_fields(user)[Label.types] == lines[-2].removeprefix("Item types: ")
    assert parse_types(read_fields(user)[Label.types]) == (MIXED, 3)
    assert types_asked(messages) == tuple(MIXED)
    # The system prompt says what each type is: the same on every call of the chapter.
    assert '"correct"' in messages[0]["content"]
    plain = Chapter.model_validate({"id": "a", "title": "A", "questions": 20})
    plain_messages = build_messages("ex", "Ex", plain, 20, [])
    assert "Item types" not in plain_messages[-1]["content"]
    assert '"correct"' not in plain_messages[0]["content"]
    assert types_asked(plain_messages) == ()


# --------------------------------------------------------------------------- the reply schema


def test_the_reply_schema_is_a_union_on_type_only_for_calls_that_ask_for_types() -> None:
    assert reply_schema() == reply_schema(("mcq",))
    assert "anyOf" not in json.dumps(reply_schema()["properties"]["questions"]["items"])[:20]
    union = reply_schema(("mcq", "truefalse", "numeric"))
    branches = union["properties"]["questions"]["items"]["anyOf"]
    assert [b["properties"]["type"]["enum"] for b in branches] == [
        ["mcq"], ["truefalse"], ["numeric"]]
    for branch in branches:  # OpenAI's strict mode: closed, every property required
        assert branch["additionalProperties"] is False
        assert set(branch["required"]) == set(branch["properties"])
        assert list(branch["properties"])[:2] == ["type", "question"]
    shape = response_format("json_schema", ("short",))
    assert shape is not None
    assert shape["json_schema"]["schema"]["properties"]["questions"]["items"][
        "properties"]["type"]["enum"] == ["short"]


# --------------------------------------------------------------------------- validation


GOOD = {
    "multi": {"type": "multi", "question": "Pick two?", "choices": ["a", "b", "c", "d", "e"],
              "correct": [3, 1], "explanation": ""},
    "truefalse": {"type": "truefalse", "question": "Water is wet.", "answer": True,
                  "explanation": ""},
    "short": {"type": "short", "question": "Capital of France?",
              "accepted": ["Paris", " Paris, France "], "explanation": ""},
    "numeric": {"type": "numeric", "question": "Pi?", "value": 3.14, "tolerance": 0.01,
                "relative": False, "unit": None, "explanation": ""},
}


def test_each_type_is_stored_with_its_answer_fields() -> None:
    multi = check_item(GOOD["multi"])
    assert (multi.type, multi.choices, multi.answer_index) == (
        "multi", ("a", "b", "c", "d", "e"), item_types.NO_INDEX)
    assert json.loads(multi.answer or "") == {"correct": [1, 3]}
    assert json.loads(check_item(GOOD["truefalse"]).answer or "") == {"value": True}
    short = check_item(GOOD["short"])
    assert short.choices == () and json.loads(short.answer or "") == {
        "accepted": ["Paris", "Paris, France"]}
    assert json.loads(check_item(GOOD["numeric"]).answer or "") == {
        "value": 3.14, "tolerance": 0.01, "relative": False, "unit": None}
    mcq = check_item({"type": "mcq", "question": "Q?", "choices": ["a", "b", "c", "d"],
                      "answer_index": 2, "explanation": ""})
    assert (mcq.type, mcq.answer) == ("mcq", None)


BAD = [
    ({"type": "essay"}, Rejection.unknown_type),
    ({**GOOD["multi"], "correct": [1]}, Rejection.bad_multi),
    ({**GOOD["multi"], "correct": [0, 1, 2, 3, 4]}, Rejection.bad_multi),
    ({**GOOD["multi"], "choices": ["a", "b", "c"], "correct": [0, 1]}, Rejection.bad_multi),
    ({**GOOD["multi"], "choices": ["a", "A", "c", "d"]}, Rejection.bad_multi),
    ({**GOOD["multi"], "correct": [1, 9]}, Rejection.bad_multi),
    ({**GOOD["truefalse"], "answer": "true"}, Rejection.bad_truefalse),
    ({**GOOD["truefalse"], "choices": ["True", "False"]}, Rejection.bad_truefalse),
    ({**GOOD["short"], "accepted": []}, Rejection.bad_short),
    ({**GOOD["short"], "accepted": ["a", "b", "c", "d", "e", "f"]}, Rejection.bad_short),
    ({**GOOD["short"], "accepted": ["Paris", "PARIS"]}, Rejection.bad_short),
    ({**GOOD["numeric"], "value": "3"}, Rejection.bad_numeric),
    ({**GOOD["numeric"], "tolerance": -1}, Rejection.bad_numeric),
    ({**GOOD["numeric"], "relative": True, "tolerance": 2}, Rejection.bad_numeric),
]


@pytest.mark.parametrize("item, reason", BAD)
def test_each_malformed_form_has_its_own_rejection_reason(
        item: dict[str, Any], reason: Rejection) -> None:
    good = check_item(GOOD["truefalse"])
    parsed = parse_questions(json.dumps({"questions": [item, GOOD["truefalse"]]}), "stop",
                             None, set())
    assert parsed.rejected == {reason: 1} and parsed.questions == [good]
    with pytest.raises(OutputInvalid) as caught:
        parse_questions(json.dumps({"questions": [item]}), "stop", None, set())
    assert caught.value.kind is reason


# --------------------------------------------------------------------------- with the mock


@pytest.fixture
def mock() -> Iterator[MockServer]:
    with MockServer(MockConfig(latency_s=0)) as server:
        yield server


def _run(settings: Any, chapters: list[dict[str, Any]], transport: Any = None,
         **syllabus: Any) -> list[Any]:
    path = write_syllabus(settings.exams_dir, "ex", {"title": "T", "chapters": chapters,
                                                     **syllabus})
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
        rows = conn.execute(text(
            "SELECT chapter_id, number, type, choices, answer_index, answer FROM question "
            "WHERE number IS NOT NULL ORDER BY chapter_id, number")).all()
    store.engine.dispose()
    return rows


def test_a_mixed_chapter_of_several_slices_stores_exactly_its_counts_with_the_mock(
        mock: MockServer, make_settings: Any) -> None:
    settings = make_settings(llm_base_url=mock.base_url, questions_per_call=4,
                             slice_questions=7, llm_response_format="json_schema")
    rows = _run(settings, [
        {"id": "mixed", "title": "Mixed", "questions": 20, "types": MIXED},
        {"id": "plain", "title": "Plain", "questions": 4}])
    mixed = [r for r in rows if r.chapter_id == "mixed"]
    assert [r.number for r in mixed] == list(range(1, 21))
    assert Counter(r.type for r in mixed) == MIXED
    assert {r.type for r in rows if r.chapter_id == "plain"} == {"mcq"}
    for r in mixed:
        answer = item_types.load(r.answer)
        choices = json.loads(r.choices)
        if r.type == "mcq":
            assert len(choices) == 4 and 0 <= r.answer_index <= 3 and r.answer is None
        elif r.type == "multi":
            assert 4 <= len(choices) <= 6 and r.answer_index == -1
            assert 2 <= len(answer["correct"]) < len(choices)
        else:
            assert choices == [] and r.answer_index == -1
    values = Counter(item_types.load(r.answer)["value"] for r in mixed if r.type == "truefalse")
    assert values == {True: 3, False: 3}
    # Multi: the number of correct choices varies.
    assert len({len(item_types.load(r.answer)["correct"]) for r in mixed
                if r.type == "multi"}) > 1
    # No call wasted on a type the slice had enough of: 2 + 2 + 2 calls for the mixed
    # chapter's slices (7, 7, 6 questions at 4 a call), 1 for the plain one.
    assert mock.stats()["billed_calls"] == 7


def test_a_reply_with_more_of_a_type_than_the_slice_lacks_keeps_only_what_it_lacks(
        make_settings: Any) -> None:
    asked: list[str] = []
    serial = iter(range(1, 10_000))

    def all_truefalse(request: httpx.Request) -> httpx.Response:
        fields = read_fields(json.loads(request.content)["messages"][-1]["content"])
        asked.append(fields[Label.types])
        counts, _ = parse_types(fields[Label.types])
        # The first reply is all true/false; later ones follow the prompt.
        kinds = ["truefalse"] * 4 if len(asked) == 1 else [
            k for k, n in counts.items() for _ in range(n)]
        items = []
        for s, kind in zip(serial, kinds):
            if kind == "truefalse":
                items.append({"type": kind, "question": f"Statement {s}.", "answer": s % 2 == 0,
                              "explanation": ""})
            else:
                items.append({"type": "mcq", "question": f"Question {s}?",
                              "choices": ["a", "b", "c", "d"], "answer_index": 0,
                              "explanation": ""})
        return reply(json.dumps({"questions": items}))

    settings = make_settings(questions_per_call=4, slice_questions=20)
    rows = _run(settings, [{"id": "a", "title": "A", "questions": 4,
                            "types": {"mcq": 2, "truefalse": 2}}],
                httpx.MockTransport(all_truefalse))
    assert Counter(r.type for r in rows) == {"mcq": 2, "truefalse": 2}
    assert asked == ["2 mcq, 2 truefalse (1 true, 1 false)", "2 mcq"]


def test_a_statement_restating_a_stored_mcqs_key_is_a_near_duplicate(
        make_settings: Any) -> None:
    stated: list[int] = []

    def replies(request: httpx.Request) -> httpx.Response:
        fields = read_fields(json.loads(request.content)["messages"][-1]["content"])
        counts, _ = parse_types(fields[Label.types])
        stated.append(len(stated))
        items: list[dict[str, Any]] = []
        if counts.get("mcq"):
            items.append({"type": "mcq", "question": "What does a load balancer do?",
                          "choices": ["Spreads incoming traffic across several servers",
                                      "Encrypts disks", "Stores backups", "Signs packages"],
                          "answer_index": 0, "explanation": ""})
        if counts.get("truefalse"):
            # The first statement restates the mcq's key; the next one is another fact.
            items.append({"type": "truefalse", "answer": True, "explanation": "",
                          "question": "A load balancer spreads incoming traffic across "
                                      "several servers." if len(stated) == 1 else
                                      "A firewall filters traffic between networks."})
        return reply(json.dumps({"questions": items}))

    settings = make_settings(questions_per_call=2, slice_questions=20)
    rows = _run(settings, [{"id": "a", "title": "Networking", "questions": 2,
                            "types": {"mcq": 1, "truefalse": 1}}],
                httpx.MockTransport(replies))
    assert [r.type for r in rows] == ["mcq", "truefalse"] and len(stated) == 2
    from storage import open_store

    store = open_store(settings.database_url)
    with store.engine.connect() as conn:
        notes = conn.execute(text("SELECT detail FROM call ORDER BY id")).scalars().all()
        statement = conn.execute(text(
            "SELECT question FROM question WHERE type = 'truefalse'")).scalar_one()
    store.engine.dispose()
    assert statement.startswith("A firewall")
    assert "1 near_duplicate rejected across types" in (notes[0] or "")


def test_a_rejected_item_is_generated_again_as_its_own_type(
        mock: MockServer, make_settings: Any) -> None:
    """Reject, then enqueue again (the number is free, its slice pending): the replacement is
    of the rejected item's type, since the slice's counts are read from what it holds."""
    from storage import open_store

    settings = make_settings(llm_base_url=mock.base_url, questions_per_call=6,
                             slice_questions=50)
    types = {"mcq": 2, "truefalse": 2, "numeric": 2}
    rows = _run(settings, [{"id": "a", "title": "A", "questions": 6, "types": types}])
    store = open_store(settings.database_url)
    with store.engine.connect() as conn:
        tf_id = conn.execute(text("SELECT id FROM question WHERE type = 'truefalse' "
                                  "ORDER BY number LIMIT 1")).scalar_one()
    store.reject("ex", tf_id, 1, "test")
    store.engine.dispose()
    rows = _run(settings, [{"id": "a", "title": "A", "questions": 6, "types": types}])
    assert Counter(r.type for r in rows) == types
    assert [r.number for r in rows] == list(range(1, 7))


def test_drop_restated_compares_other_types_in_the_chapters_language() -> None:
    """The check both the sync pipeline and batch mode run (runner.pipeline.drop_restated): a
    statement restating a kept mcq's key is dropped, in Persian retyped with Arabic letters
    too; an mcq against an mcq is the commit's check, not this one; a kept item joins the
    compared set, so a later item of the same batch is compared with it."""
    from examforge.neardup import Checker
    from examforge.output import Question
    from runner.pipeline import drop_restated

    def item(kind: str, text: str, answer: Any = None, choices: tuple[str, ...] = ()) -> Any:
        return Question(text, choices or ("", "", "", ""), 0 if kind == "mcq" else None,
                        "", type=kind, answer=json.dumps(answer) if answer is not None
                        else None)

    mcq = item("mcq", "متعادل‌کننده بار چه کاری انجام می‌دهد؟", choices=(
        "ترافیک ورودی را میان چند سرور پخش می‌کند", "دیسک‌ها را رمزگذاری می‌کند",
        "پشتیبان‌ها را نگه می‌دارد", "بسته‌ها را امضا می‌کند"))
    restated = item("truefalse", "متعادل‌کننده بار ترافيك ورودي را ميان چند سرور پخش مي‌كند.",
                    {"value": True})
    other = item("truefalse", "دیوار آتش ترافیک میان شبکه‌ها را پالایش می‌کند.",
                 {"value": True})
    again = item("mcq", mcq.question, choices=mcq.choices)
    keyed: list[Any] = []
    kept, dropped = drop_restated(keyed, [mcq, restated, other, again], Checker(), "شبکه", "fa")
    assert kept == [mcq, other, again] and dropped == 1
    assert [kind for kind, _ in keyed] == ["mcq", "truefalse", "mcq"]
