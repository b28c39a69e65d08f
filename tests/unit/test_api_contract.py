"""The patterns the OpenAPI document states are the ones the code reads (issue 30): every
string a pattern matches is taken by the code behind it, and what the code gives out (a
page's cursor) matches its pattern. Hypothesis draws the strings from the patterns."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from examforge.sources import MAX_NAME_CHARS, check_name
from producer.api.app import SOURCE_NAME_PATTERN
from producer.api.review import IF_MATCH_PATTERN, _version
from producer.audit import SINCE_PATTERN, since_epoch_s
from storage.access import AUDIT_CURSOR_PATTERN, decode_audit_cursor, encode_audit_cursor
from storage.reports import EXAM_CURSOR_PATTERN, decode_cursor, encode_cursor

FEW = settings(max_examples=200, deadline=None, database=None, derandomize=True)


class _Clock:
    def database_now(self) -> float:
        return 1_765_000_000.0


@FEW
# created_at is epoch seconds on the database's clock (tests set small ones, never below 1).
@given(st.just(0.0) | st.floats(min_value=1, max_value=1e16, allow_nan=False,
                                allow_infinity=False),
       st.from_regex(r"[a-z0-9][a-z0-9-]{0,63}", fullmatch=True))
def test_an_exam_cursor_matches_its_pattern_and_reads_back(created_at, slug):
    cursor = encode_cursor(created_at, slug)
    assert re.fullmatch(EXAM_CURSOR_PATTERN, cursor), cursor
    assert decode_cursor(cursor) == (created_at, slug)


@FEW
@given(st.from_regex(EXAM_CURSOR_PATTERN, fullmatch=True))
def test_every_string_of_the_exam_cursor_pattern_is_a_cursor(cursor):
    decode_cursor(cursor)


@FEW
@given(st.integers(min_value=1, max_value=2**53))
def test_an_audit_cursor_matches_its_pattern_and_reads_back(row_id):
    cursor = encode_audit_cursor(row_id)
    assert re.fullmatch(AUDIT_CURSOR_PATTERN, cursor)
    assert decode_audit_cursor(cursor) == row_id


@FEW
@given(st.from_regex(SINCE_PATTERN, fullmatch=True))
def test_every_since_of_its_pattern_is_read(since):
    assert isinstance(since_epoch_s(since, _Clock()), float)


@FEW
@given(st.from_regex(IF_MATCH_PATTERN, fullmatch=True))
def test_every_if_match_of_its_pattern_names_a_version(tag):
    assert isinstance(_version(tag, None), int)


@FEW
@given(st.from_regex(SOURCE_NAME_PATTERN, fullmatch=True).filter(
    lambda n: len(n) <= MAX_NAME_CHARS))
def test_every_source_name_of_its_pattern_is_a_name(name):
    assert check_name(name) == name


def test_the_patterns_refuse_what_the_code_refuses():
    for bad in ("not-a-cursor", "eyJhIjoxfQ", "1.5", "_demo", "1.5_Demo"):
        assert not re.fullmatch(EXAM_CURSOR_PATTERN, bad)
    for bad in ("0", "01", "zz", "-3"):
        assert not re.fullmatch(AUDIT_CURSOR_PATTERN, bad)
    for bad in ("2026-02-29", "2026-04-31", "2026-12-01T24:00", "yesterday", "7w"):
        assert not re.fullmatch(SINCE_PATTERN, bad), bad
    for bad in ('"0"', '"03"', "soon", '"1234567890123456"'):
        assert not re.fullmatch(IF_MATCH_PATTERN, bad), bad
    for bad in ("../x.md", "a/.hidden.md", "x.doc", "/abs.md", "a\\b.md", "a//b.md"):
        assert not re.fullmatch(SOURCE_NAME_PATTERN, bad), bad
