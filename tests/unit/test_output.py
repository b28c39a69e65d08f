"""examforge.output.parse_questions: untrusted model replies, as tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from examforge.errors import OutputInvalid
from examforge.output import Parsed, Question, normalise, parse_questions
from fakellm import question


def q(i: int, **overrides: Any) -> dict[str, Any]:
    item = dict(question(i))
    item.update(overrides)
    return item


def reply(*items: Any) -> str:
    return json.dumps({"questions": list(items)})


def parse(content: str | None, *, wanted: int | None = 5, known: set[str] | None = None,
          finish_reason: str | None = "stop") -> Parsed:
    return parse_questions(content, finish_reason, wanted, known if known is not None else set())


def invalid(content: str | None, *, wanted: int = 5, known: set[str] | None = None,
            finish_reason: str | None = "stop") -> OutputInvalid:
    with pytest.raises(OutputInvalid) as info:
        parse(content, wanted=wanted, known=known, finish_reason=finish_reason)
    return info.value


# --- valid replies --------------------------------------------------------------------------

def test_valid_reply() -> None:
    parsed = parse(reply(q(1), q(2), q(3)))
    assert parsed.rejected == {}
    assert parsed.questions == [
        Question("[c] Question number 1?", ("a", "b", "c", "d"), 1, "because 1"),
        Question("[c] Question number 2?", ("a", "b", "c", "d"), 2, "because 2"),
        Question("[c] Question number 3?", ("a", "b", "c", "d"), 3, "because 3"),
    ]
    assert isinstance(parsed.questions[0].choices, tuple)


def test_fields_are_stripped_and_explanation_optional() -> None:
    item = {"question": "  What is 2+2?\n", "choices": [" 3", "4 ", "5", "\t22"],
            "answer_index": 1}
    assert parse(reply(item)).questions == [Question("What is 2+2?", ("3", "4", "5", "22"), 1, "")]


def test_multiline_explanation_and_unicode_are_kept() -> None:
    item = q(1, explanation="Line one.\n\tLine two: ✓ café", question="Qu'est-ce que ça? 日本")
    parsed = parse(reply(item))
    assert parsed.questions[0].explanation == "Line one.\n\tLine two: ✓ café"
    assert parsed.questions[0].question == "Qu'est-ce que ça? 日本"


@pytest.mark.parametrize("answer_index", [0, 1, 2, 3])
def test_every_answer_index_in_range(answer_index: int) -> None:
    assert parse(reply(q(1, answer_index=answer_index))).questions[0].answer_index == answer_index


def test_extra_keys_in_the_envelope_and_items_are_ignored() -> None:
    content = json.dumps({"questions": [q(1, difficulty="easy")], "note": "hi"})
    assert len(parse(content).questions) == 1


FENCED = [
    "```json\n{body}\n```",
    "```\n{body}\n```",
    "```JSON\n{body}\n```",
    "  ```json\n{body}\n```  \n",
    "```json\n\n{body}\n\n```",
    "```json{body}```",
    "```{body}```",
]


@pytest.mark.parametrize("template", FENCED)
def test_fenced_json(template: str) -> None:
    content = template.replace("{body}", reply(q(1), q(2)))
    parsed = parse(content)
    assert [x.question for x in parsed.questions] == ["[c] Question number 1?",
                                                      "[c] Question number 2?"]
    assert parsed.rejected == {}


# --- replies with nothing usable ------------------------------------------------------------

@pytest.mark.parametrize(
    ("content", "finish_reason", "kind"),
    [
        ('{"questions": [{"question": "Wh', "length", "truncated"),
        ('{"questions": [' + json.dumps(q(1))[:-1], "length", "truncated"),  # no closing brace
        ('{"questions": [', "length", "truncated"),
        ("```json\n{\"questions\": [{", "length", "truncated"),
        (None, "length", "truncated"),
        (None, "stop", "empty"),
        ("", "stop", "empty"),
        ("   \n\t ", "stop", "empty"),
        (None, None, "empty"),
        ("I'm sorry, but I can't help with that.", "stop", "refusal"),
        ("Im sorry, no.", "stop", "refusal"),
        ("I am sorry, I cannot do this", "stop", "refusal"),
        ("I can't write exam questions about that.", "stop", "refusal"),
        ("I cannot comply.", "stop", "refusal"),
        ("Sorry, that topic is not allowed.", "stop", "refusal"),
        ("As an AI language model, I must decline.", "stop", "refusal"),
        ("  i'M SORRY", "content_filter", "refusal"),
        ("{not json", "stop", "malformed_json"),
        ('{"questions": [', "stop", "malformed_json"),
        ("Here are your questions: " + reply(q(1)), "stop", "malformed_json"),
        ("Sure! I'd be glad to help.", "stop", "malformed_json"),
        ("```json\n{broken\n```", "stop", "malformed_json"),
        ("[" * 100_000 + "]" * 100_000, "stop", "malformed_json"),   # RecursionError inside
        ('{"questions": [{"answer_index": ' + "1" * 5000 + "}]}", "stop", "malformed_json"),
        ('{"items": []}', "stop", "wrong_schema"),
        ('{"questions": "none"}', "stop", "wrong_schema"),
        ('{"questions": {"0": {}}}', "stop", "wrong_schema"),
        ('{"questions": null}', "stop", "wrong_schema"),
        ("[]", "stop", "wrong_schema"),
        (json.dumps([q(1)]), "stop", "wrong_schema"),
        ('"just a string"', "stop", "wrong_schema"),
        ("42", "stop", "wrong_schema"),
        ("null", "stop", "wrong_schema"),
        ('{"questions": []}', "stop", "too_few"),
        (reply({"question": "x"}, "junk", 7, None), "stop", "wrong_schema"),
    ],
)
def test_nothing_usable(content: str | None, finish_reason: str | None, kind: str) -> None:
    err = invalid(content, finish_reason=finish_reason)
    assert err.kind == kind
    assert str(err).startswith(f"{kind}: ")


def test_error_detail_is_short_and_storable() -> None:
    # The detail goes into the call record: bounded, and free of what PostgreSQL refuses.
    err = invalid("{broken \x00 json \ud800 and \x1b[2J " + "x" * 500)
    assert err.kind == "malformed_json"
    assert len(str(err)) <= len("malformed_json: ") + 80
    for bad in ("\x00", "\ud800", "\x1b"):
        assert bad not in str(err)
    str(err).encode("utf-8")  # no lone surrogate left
    refusal = invalid("I'm sorry \x00 no")
    assert refusal.kind == "refusal" and "\x00" not in str(refusal)


def test_refusal_detail_is_the_text() -> None:
    assert str(invalid("  I'm sorry, I can't.  ")) == "refusal: I'm sorry, I can't."


def test_truncated_message() -> None:
    assert str(invalid('{"questions": [{"question": "Wh', finish_reason="length")) == (
        "truncated: finish_reason is length; no complete question before the cut")


def _cut(items: list[dict[str, Any]], at: int) -> str:
    """The reply of `items`, pretty-printed as models write it, cut after `at` characters."""
    return json.dumps({"questions": items}, indent=2)[:at]


def test_a_cut_reply_keeps_every_complete_question_before_the_cut() -> None:
    items = [q(i) for i in range(1, 6)]
    full = json.dumps({"questions": items}, indent=2)
    # Cut anywhere: exactly the objects whose closing brace arrived are kept, whole.
    for at in range(len('{"questions": [') + 1, len(full) - 3):
        head = full[:at]
        closed = head.count("\n    }")
        try:
            parsed = parse(head, wanted=None, finish_reason="length")
        except OutputInvalid as err:
            assert closed == 0 and err.kind == "truncated", at
            continue
        assert parsed.truncated and parsed.questions == [
            parse(reply(q(i))).questions[0] for i in range(1, closed + 1)], at


def test_a_cut_reply_whose_json_happens_to_be_whole_keeps_it_all() -> None:
    parsed = parse(reply(q(1), q(2)), finish_reason="length")
    assert len(parsed.questions) == 2 and parsed.truncated


def test_a_cut_fenced_reply_is_recovered_too() -> None:
    parsed = parse("```json\n" + _cut([q(1), q(2)], 260), wanted=None, finish_reason="length")
    assert [x.question for x in parsed.questions] == ["[c] Question number 1?"]


def test_a_cut_object_missing_its_explanation_is_not_taken_for_one_without() -> None:
    # The explanation's string was cut: partial parsing drops it, and the object would pass
    # as a question with no explanation. A cut reply's objects must carry it.
    head = '{"questions": [' + json.dumps(q(1)) + ', {"question": "Q2?", "choices": ' \
           '["a", "b", "c", "d"], "answer_index": 1, "explanation": "because }'
    parsed = parse(head, wanted=None, finish_reason="length")
    assert [x.question for x in parsed.questions] == ["[c] Question number 1?"]


def test_without_wanted_every_valid_question_passes() -> None:
    parsed = parse(reply(*[q(i) for i in range(1, 13)], q(3)), wanted=None)
    assert len(parsed.questions) == 12 and parsed.rejected == {"duplicate": 1}


@pytest.mark.parametrize("finish_reason", ["stop", None, "content_filter", "tool_calls", "eos"])
def test_other_finish_reasons_are_not_truncation(finish_reason: str | None) -> None:
    assert len(parse(reply(q(1)), finish_reason=finish_reason).questions) == 1


# --- item validation ------------------------------------------------------------------------

BAD_ITEMS: list[tuple[str, Any]] = [
    ("three choices", q(1, choices=["a", "b", "c"])),
    ("five choices", q(1, choices=["a", "b", "c", "d", "e"])),
    ("no choices", q(1, choices=[])),
    ("choices missing", {"question": "Q?", "answer_index": 0}),
    ("choices a string", q(1, choices="abcd")),
    ("choices an object", q(1, choices={"a": 1, "b": 2, "c": 3, "d": 4})),
    ("duplicate choices", q(1, choices=["a", "b", "a", "d"])),
    ("duplicate choices after normalising", q(1, choices=["Paris", " paris", "Rome", "Oslo"])),
    ("duplicate choices by inner whitespace", q(1, choices=["New  York", "new york", "b", "c"])),
    ("non-string choices", q(1, choices=[1, 2, 3, 4])),
    ("one non-string choice", q(1, choices=["a", "b", "c", None])),
    ("nested choice", q(1, choices=["a", "b", "c", ["d"]])),
    ("empty choice", q(1, choices=["a", "b", "c", ""])),
    ("blank choice", q(1, choices=["a", "b", "c", "   "])),
    ("answer_index 4", q(1, answer_index=4)),
    ("answer_index -1", q(1, answer_index=-1)),
    ("answer_index True", q(1, answer_index=True)),
    ("answer_index False", q(1, answer_index=False)),
    ("answer_index string", q(1, answer_index="1")),
    ("answer_index float", q(1, answer_index=1.0)),
    ("answer_index null", q(1, answer_index=None)),
    ("answer_index missing", {"question": "Q?", "choices": ["a", "b", "c", "d"]}),
    ("answer_index huge", q(1, answer_index=10**30)),
    ("question missing", {"choices": ["a", "b", "c", "d"], "answer_index": 0}),
    ("question empty", q(1, question="")),
    ("question blank", q(1, question=" \n ")),
    ("question not a string", q(1, question=["Q?"])),
    ("explanation not a string", q(1, explanation=["because"])),
    ("explanation null", q(1, explanation=None)),
    ("item a string", "What is X?"),
    ("item a list", ["Q?", ["a", "b", "c", "d"], 0]),
    ("item null", None),
    ("NUL in question", q(1, question="What\x00 is X?")),
    ("NUL in a choice", q(1, choices=["a", "b\x00", "c", "d"])),
    ("NUL in explanation", q(1, explanation="because\x00")),
    ("lone surrogate in question", q(1, question="What is \ud800?")),
    ("lone surrogate in a choice", q(1, choices=["a", "b", "c", "\udfff"])),
    ("terminal escape in question", q(1, question="\x1b[2JWhat?")),
    ("C1 CSI in explanation", q(1, explanation="a\x9b31mb")),
    ("DEL in a choice", q(1, choices=["a", "b", "c", "d\x7f"])),
]


@pytest.mark.parametrize("item", [i for _, i in BAD_ITEMS], ids=[n for n, _ in BAD_ITEMS])
def test_bad_item_is_rejected_and_good_ones_kept(item: Any) -> None:
    parsed = parse(reply(q(1), item, q(2)))
    assert [x.question for x in parsed.questions] == ["[c] Question number 1?",
                                                      "[c] Question number 2?"]
    assert parsed.rejected == {"wrong_schema": 1}


@pytest.mark.parametrize("item", [i for _, i in BAD_ITEMS], ids=[n for n, _ in BAD_ITEMS])
def test_bad_item_alone_is_wrong_schema(item: Any) -> None:
    assert invalid(reply(item)).kind == "wrong_schema"


def test_escaped_controls_in_json_are_caught_too() -> None:
    # What arrives is JSON text: the bad characters come as \u escapes.
    content = '{"questions": [{"question": "A\\u0000B?", "choices": ["a","b","c","d"], ' \
              '"answer_index": 0}, {"question": "C\\ud800?", "choices": ["a","b","c","d"], ' \
              '"answer_index": 0}]}'
    assert invalid(content).kind == "wrong_schema"


def test_allowed_whitespace_controls() -> None:
    item = q(1, question="Line\tone\r\nline two?", explanation="a\nb\tc")
    assert parse(reply(item)).questions[0].question == "Line\tone\r\nline two?"


def test_mixed_valid_and_invalid_counts_rejected_by_kind() -> None:
    known = {normalise("[c] Question number 9?")}
    content = reply(
        q(1),
        q(2, choices=["a", "b", "c"]),            # wrong_schema
        q(3),
        q(1, explanation="again"),                 # duplicate within the reply
        q(9),                                      # duplicate of known
        q(4, answer_index=7),                      # wrong_schema
        q(5, answer_index="2"),                    # wrong_schema
        q(6),
    )
    parsed = parse(content, wanted=10, known=known)
    assert [x.question for x in parsed.questions] == [
        "[c] Question number 1?", "[c] Question number 3?", "[c] Question number 6?"]
    assert parsed.rejected == {"wrong_schema": 3, "duplicate": 2}


# --- wanted and duplicates ------------------------------------------------------------------

@pytest.mark.parametrize(("given", "wanted", "kept"), [(7, 5, 5), (5, 5, 5), (3, 5, 3),
                                                     (10, 1, 1), (1, 1, 1)])
def test_extras_beyond_wanted_are_dropped(given: int, wanted: int, kept: int) -> None:
    parsed = parse(reply(*[q(i) for i in range(1, given + 1)]), wanted=wanted)
    assert [x.question for x in parsed.questions] == [
        f"[c] Question number {i}?" for i in range(1, kept + 1)]
    assert parsed.rejected == {}  # extras are not "rejected": the reply was fine


def test_invalid_items_do_not_count_towards_wanted() -> None:
    parsed = parse(reply(q(1, answer_index=9), q(2, answer_index=9), q(3), q(4)), wanted=2)
    assert [x.question for x in parsed.questions] == ["[c] Question number 3?",
                                                      "[c] Question number 4?"]
    assert parsed.rejected == {"wrong_schema": 2}


@pytest.mark.parametrize(
    "variant",
    ["[c] Question number 1?", "[C] QUESTION NUMBER 1?", "  [c]   question\tnumber\n1?  ",
     "[c] Question Number 1?"],
)
def test_duplicate_of_known_is_rejected_normalised(variant: str) -> None:
    known = {normalise("[c] Question number 1?")}
    parsed = parse(reply(q(1, question=variant), q(2)), known=known)
    assert [x.question for x in parsed.questions] == ["[c] Question number 2?"]
    assert parsed.rejected == {"duplicate": 1}


@pytest.mark.parametrize("variant", ["what is x?", "WHAT IS X?", " What  is\nX? "])
def test_duplicate_within_reply_is_rejected(variant: str) -> None:
    parsed = parse(reply(q(1, question="What is X?"), q(2, question=variant), q(3)))
    assert [x.question for x in parsed.questions] == ["What is X?", "[c] Question number 3?"]
    assert parsed.rejected == {"duplicate": 1}


def test_near_duplicates_are_distinct() -> None:
    parsed = parse(reply(q(1, question="What is X?"), q(2, question="What is X ?"),
                         q(3, question="What is Y?")))
    assert len(parsed.questions) == 3


def test_duplicate_of_a_dropped_extra_is_still_a_duplicate() -> None:
    parsed = parse(reply(q(1), q(2), q(2)), wanted=1)
    assert [x.question for x in parsed.questions] == ["[c] Question number 1?"]
    assert parsed.rejected == {"duplicate": 1}


def test_all_duplicates() -> None:
    known = {normalise(f"[c] Question number {i}?") for i in (1, 2, 3)}
    err = invalid(reply(q(1), q(2), q(3), q(3)), known=known)
    assert err.kind == "duplicate"
    assert str(err) == "duplicate: no valid question in reply"


def test_mostly_duplicates_and_some_invalid_names_the_larger_kind() -> None:
    known = {normalise("[c] Question number 1?"), normalise("[c] Question number 2?")}
    assert invalid(reply(q(1), q(2), q(3, answer_index=5)), known=known).kind == "duplicate"
    assert invalid(reply(q(1), q(4, answer_index=5), q(5, choices=[])),
                   known=known).kind == "wrong_schema"


def test_known_is_not_modified() -> None:
    known = {normalise("something else")}
    before = set(known)
    parse(reply(q(1), q(2)), known=known)
    assert known == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [("What is X?", "what is x?"), ("  A \t B\n C  ", "a b c"), ("ÉCOLE", "école"), ("", "")],
)
def test_normalise(text: str, expected: str) -> None:
    assert normalise(text) == expected
