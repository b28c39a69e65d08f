"""The one normal form (examforge.output.canonical) the exact hash and the near-duplicate
signatures share: its edge cases, which the database tests (tests/integration/
test_normal_form.py) do not each store."""

from __future__ import annotations

import unicodedata

import pytest

from examforge.neardup import signature
from examforge.output import canonical, normalise, text_hash

BASE = "Which AWS region hosts the café's S3 bucket?"


@pytest.mark.parametrize("variant", [
    unicodedata.normalize("NFD", BASE),
    BASE.replace("AWS", "ＡＷＳ").replace("S3", "Ｓ３"),
    BASE.replace("AWS", "A\u200bW\u200dS"),  # zero-width space and joiner
    BASE.replace("region", "re\u00adgion"),  # soft hyphen
    "\ufeff" + BASE,  # BOM
    BASE.replace("café", "\u200ecafé\u200f"),  # bidi marks
    BASE.replace(" ", "\u00a0 \t\n "),  # no-break space, tab, newline
    "  " + BASE + "  ",
], ids=["NFD", "full-width", "zero-width", "soft hyphen", "BOM", "bidi", "spaces", "ends"])
def test_a_variant_has_the_hash_and_signature_of_the_original(variant):
    assert variant != BASE
    assert canonical(variant) == BASE
    assert text_hash(variant) == text_hash(BASE)
    assert signature(variant, "Storage") == signature(BASE, "Storage")
    assert signature(variant).keys == signature(BASE).keys == {"aw", "s3"}  # stemmed


def test_a_format_character_between_a_letter_and_its_accent_is_removed_before_composing():
    assert canonical("cafe\u200b\u0301") == "café" == unicodedata.normalize("NFC", "café")


def test_case_is_kept_by_the_form_and_dropped_by_the_hash():
    assert canonical("ＡＷＳ s3") == "AWS s3"
    assert normalise("ＡＷＳ  S3") == "aws s3"
    assert text_hash("AWS S3") == text_hash("aws s3")


def test_every_format_character_is_removed():
    cf = "".join(chr(cp) for cp in range(0x80, 0x110000) if unicodedata.category(chr(cp)) == "Cf")
    assert len(cf) > 150 and canonical(f"A{cf}WS") == "AWS"
