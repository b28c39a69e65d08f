"""The commit's signing step (issue 33, "signatures without Python loops"): the signatures
and band keys of many texts, of one reply or of several calls' replies together, computed in
one vectorised pass (examforge.neardup.sign_many, storage.neardup.Signed.many and .groups).

The band keys are stored with each question and looked up by every later commit, so the
group step must give every text exactly the keys the per-text reference gives it
(`band_keys(signature(...))`, examforge/neardup.py's `minhash`, left as it was): on every
language's labelled pairs, on random texts in every language's script, in groups of any size
and mix of chapters and languages. A digest of the keys of the labelled pairs, taken with the
code before the change, pins them against both functions changing together."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest
from neardup_pairs import PAIRS, SWAPPED, TITLES
from test_neardup import MUST_CATCH, MUST_NOT_CATCH

from examforge import neardup as nd
from storage.neardup import Signed

LANGS = ("en", "fa", "ar", "ru")

# Letters of each script as the models write them, variants and marks included: Persian's
# ZWNJ and digits, Arabic's diacritics, tatweel, bare alefs and teh marbuta, Russian's ё.
_LETTERS = {
    "en": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "fa": "ابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهیيكآأإۀ\u200c",
    "ar": "ابتثجحخدذرزسشصضطظعغفقكلمنهويىةءأإآ\u064b\u064e\u064f\u0650\u0651\u0652\u0640",
    "ru": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯ",
}
_DIGITS = {"en": "0123456789", "fa": "۰۱۲۳۴۵۶۷۸۹", "ar": "٠١٢٣٤٥٦٧٨٩", "ru": "0123456789"}
_EXTRAS = ["EC2", "S3", "DynamoDB", "m5.large", "IPv6", "HTTPS", "1,000", "99.9%", "250ms",
           "twenty-five", "seven", "Which of the following", "\u200b", "?", ",", ":", "«»",
           "—", "(", ")", "10 000", "99,9"]


def labelled_texts(lang: str) -> list[str]:
    """Every text of a language's labelled pairs (English with test_neardup.py's)."""
    catch, keep = PAIRS[lang]
    pairs = catch + keep + SWAPPED[lang]
    if lang == "en":
        pairs = pairs + MUST_CATCH + MUST_NOT_CATCH
    return [t for pair in pairs for t in pair]


def random_texts(lang: str, n: int, seed: int) -> list[str]:
    """Texts of 0 to 40 pieces: words of the labelled pairs (stop words, number words,
    inflections), random words of the script, numbers in its digits, identifiers, marks."""
    rng = random.Random(f"{lang}-{seed}")
    vocabulary = " ".join(labelled_texts(lang)).split()
    letters, digits = _LETTERS[lang], _DIGITS[lang]
    out = []
    for _ in range(n):
        pieces = []
        for _ in range(rng.randrange(41)):
            kind = rng.random()
            if kind < 0.5:
                pieces.append(rng.choice(vocabulary))
            elif kind < 0.75:
                pieces.append("".join(rng.choice(letters) for _ in range(rng.randint(1, 9))))
            elif kind < 0.85:
                pieces.append("".join(rng.choice(digits) for _ in range(rng.randint(1, 5))))
            else:
                pieces.append(rng.choice(_EXTRAS))
        out.append(rng.choice([" ", "  ", "\n", "، ", ", "]).join(pieces))
    return out


def reference(text: str, context: str, language: str) -> tuple[nd.Signature, list[int]]:
    """The per-text function, as every stored key was computed before the group step."""
    sig = nd.signature(text, context, language)
    return sig, nd.band_keys(sig)


def _check(items: list[tuple[str, str, str]]) -> None:
    got = nd.sign_many(items)
    assert len(got) == len(items)
    for (text, context, language), (sig, keys) in zip(items, got):
        ref_sig, ref_keys = reference(text, context, language)
        assert sig == ref_sig and sig.text == ref_sig.text, text
        assert keys == ref_keys, (text, language)


@pytest.mark.parametrize("lang", LANGS)
def test_the_group_step_gives_each_labelled_text_its_own_keys(lang: str) -> None:
    items = [(t, TITLES[lang], lang) for t in labelled_texts(lang)]
    _check(items)
    # Under every language's rules (a chapter may be tagged wrong), and without a title.
    _check([(t, "", other) for t, _, _ in items for other in LANGS])


@pytest.mark.parametrize("lang", LANGS)
def test_the_group_step_gives_each_random_text_its_own_keys(lang: str) -> None:
    texts = random_texts(lang, 300, seed=1)
    assert any(not nd.signature(t, "", lang).tokens for t in texts)  # the empty case is met
    _check([(t, TITLES[lang], lang) for t in texts])
    _check([(t, "", other) for t in texts[:60] for other in LANGS])


@pytest.mark.parametrize("size", [1, 5, 20, 100])
def test_replies_of_any_size_and_mix_of_chapters_sign_as_each_text_alone(size: int) -> None:
    # A group commit's replies: several chapters and languages in one pass, in any order.
    rng = random.Random(size)
    batches = []
    for i in range(6):
        lang = rng.choice(LANGS)
        texts = random_texts(lang, size, seed=100 + i)[: size // 2] + \
            rng.sample(labelled_texts(lang), size - size // 2)
        batches.append((texts, TITLES[lang] if i % 2 else "", lang))
    batches.insert(2, ([], "Empty", "en"))  # a reply left with nothing
    groups = Signed.groups(batches)
    assert [len(g) for g in groups] == [len(texts) for texts, _, _ in batches]
    for (texts, context, language), group in zip(batches, groups):
        assert group == Signed.many(texts, context, language)
        for text, signed in zip(texts, group):
            sig, keys = reference(text, context, language)
            assert signed.sig == sig and list(signed.keys) == keys
            assert signed.blob() == struct.pack(f"<{len(keys)}Q", *keys)
            assert Signed.of(text, context, language) == signed
    assert Signed.groups([]) == [] and Signed.many([]) == []


def test_both_ways_of_taking_the_minima_give_the_same_keys() -> None:
    # Texts of like lengths are laid out one row each (the short ones filled up with a
    # repeated token); a group with one much longer text is reduced over runs (reduceat).
    texts = labelled_texts("en")[:40]
    long = " ".join(random_texts("en", 40, seed=7))
    ways = []
    for group in (texts, texts + [long], [long] + texts, [long], [texts[0], "", long]):
        sigs = [nd.signature(t, TITLES["en"]) for t in group]
        sizes = [len(s.tokens) for s in sigs if s.tokens]
        ways.append(len(sizes) * max(sizes) <= 2 * sum(sizes))  # band_keys_many's choice
        assert nd.band_keys_many(sigs) == [nd.band_keys(s) for s in sigs]
    assert ways[:4] == [True, False, False, True]


# sha256 of every band key of the labelled pairs (each language's texts under its title, in
# order, each key as 8 little-endian bytes and each text's keys followed by a zero byte),
# computed with examforge/neardup.py as it was before the group step (commit 154255e). Any
# change to it changes the keys stored in every database: SIGNATURE_VERSION and a migration.
PINNED = "78a13b5230b9383490c2ac2a25fa9d27520deb5c1fd75e99935f79a85ece85e6"


def keys_digest(keyed: list[list[int]]) -> str:
    h = hashlib.sha256()
    for keys in keyed:
        h.update(struct.pack(f"<{len(keys)}Q", *keys) + b"\0")
    return h.hexdigest()


def test_the_keys_of_the_labelled_pairs_are_the_ones_stored_before() -> None:
    items = [(t, TITLES[lang], lang) for lang in LANGS for t in labelled_texts(lang)]
    assert keys_digest([keys for _, keys in nd.sign_many(items)]) == PINNED
    assert keys_digest([reference(*item)[1] for item in items]) == PINNED


# sha256 of the stored signature (`Signature.encode`: tokens, key terms), the edit text and the
# band keys of 200 random texts of each language signed under its own rules and title
# (`signed_digest`), taken with the code before the group step (commit 154255e): the
# tokeniser's output pinned on texts nobody wrote by hand, marks and digits of every script.
PINNED_RANDOM = "d9bfc51a58c019a54f99ea99990239ecb2f7d99ffb13e58ef24df5586af1f0b6"


def signed_digest(signed: list[tuple[nd.Signature, list[int]]]) -> str:
    h = hashlib.sha256()
    for sig, keys in signed:
        tokens, key_terms = sig.encode()
        h.update("\x1f".join((tokens, key_terms, sig.text)).encode() + b"\0")
        h.update(struct.pack(f"<{len(keys)}Q", *keys) + b"\0")
    return h.hexdigest()


def test_the_signatures_of_random_texts_are_the_ones_stored_before() -> None:
    items = [(t, TITLES[lang], lang) for lang in LANGS for t in random_texts(lang, 200, seed=2)]
    assert signed_digest(nd.sign_many(items)) == PINNED_RANDOM


def test_the_benchmarks_baseline_signs_as_the_group_step_does() -> None:
    # bench/signing.py measures the group step against copies of the code before it: they
    # must compute the same signatures and keys, or the comparison is of different work.
    from bench.signing import _band_keys_many_before, _signature_before, measure, report

    items = [(t, TITLES[lang], lang) for lang in LANGS
             for t in labelled_texts(lang)[:60] + random_texts(lang, 60, seed=3)]
    before = [_signature_before(*item) for item in items]
    after = nd.sign_many(items)
    assert [(s, s.text) for s in before] == [(s, s.text) for s, _ in after]
    assert _band_keys_many_before(before) == [keys for _, keys in after]
    got = measure(sizes=(1, 5), questions=10)
    assert sorted(got) == [1, 5] and all(v > 0 for row in got.values() for v in row.values())
    assert len(report(got)) == 4


def test_the_translators_equal_str_translate() -> None:
    # examforge.neardup_lang.translator replaces the characters of a table that a text holds,
    # found by a pattern, instead of looking each character up (str.translate): the same
    # text, for every table the rules use, on texts holding every key of the tables.
    from examforge.neardup_lang import _ARABIC, _PERSIAN, RULES, translator

    rng = random.Random(5)
    tables = [_PERSIAN, _ARABIC, *(r.fold for r in RULES.values())]
    specials = [chr(cp) for table in tables for cp in table] + ["]", "\\", "^", "-"]
    texts = [t for lang in LANGS for t in random_texts(lang, 100, seed=4)]
    texts = [t[:i] + "".join(rng.sample(specials, 8)) + t[i:]
             for t in texts for i in [rng.randrange(len(t) + 1)]] + texts + ["".join(specials)]
    for table in tables + [{ord("a"): "b", ord("b"): "c", ord("]"): None, ord("-"): "^"}, {}]:
        fold = translator(table)
        assert all(fold(t) == t.translate(table) for t in texts)
