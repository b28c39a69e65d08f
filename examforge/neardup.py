"""Near-duplicate questions: a reworded repeat of a question the chapter (or the exam) has.

A question's *signature* is the set of its content words, normalised so that the surface
changes a model makes when it repeats itself do not count, by the rules of its chapter's
language (examforge.neardup_lang: each script's letter variants and digits, the language's
Snowball stemmer, stop words, lead-ins and number words). In English: case, punctuation,
"Which of the following ..." lead-ins, stop words, inflections (Snowball's English stemmer),
and the formatting of numbers ("1,000" and "1000", "seven" and "7", "99.9%" and "99.9 percent",
"250ms" and "250 ms"). Two questions are near-duplicates when the Jaccard similarity of their
signatures reaches NEAR_DUP_THRESHOLD, unless their *key terms* were swapped: when each has a
number or an identifier (an acronym such as HTTPS, a name such as EC2 or DynamoDB) that the
other lacks, they ask about different facts ("port 22" against "port 443", "S3" against
"EBS") however alike the rest of the sentence is. A key term present on one side only (an
acronym spelled out on the other) is not a swap.

Why MinHash and not rapidfuzz. Both were tried on the labelled pairs of
tests/unit/test_neardup.py (paraphrases written by hand, pairs of one template asking
different facts, the mock's rewordings and its closest distinct questions; the test prints
the comparison): at its best threshold each of rapidfuzz's scorers gets some pairs wrong
(token_set_ratio 5, token_sort_ratio 6, ratio 24 of 528), the Jaccard of signatures none at
0.5. And rapidfuzz only compares two strings: finding the near-duplicates of a new question
among 5,000 stored ones means scoring all 5,000. MinHash estimates that same Jaccard from 256
hash minima, and the LSH banding of those minima (64 bands of 4) gives every question 64
*band keys* such that two questions of Jaccard 0.5 share at least one with probability 0.98
(0.6: 0.9996; 0.3: 0.41; 0.1: 0.006). The band keys are stored with each question and
indexed in memory (storage.neardup), so the candidates of a new question are found by
lookups whose number does not grow with the chapter; the candidates are then verified with
the exact Jaccard of the stored signatures. The banding is the textbook one (Leskovec,
Rajaraman, Ullman, Mining of Massive Datasets, 3.4).

Why the MinHash is computed here and not by datasketch (which the first version used, and
which the tests keep as the reference its estimates are compared with): importing datasketch
imports its LSH classes and with them scipy, 0.5 s of CPU and 40 MB in every process that
checks a question, and its per-object set-up cost more than the hashing at five questions a
call. What is used of it is one formula, the affine scheme of its `affine32` MinHash: each
token hashed to 32 bits (blake2b) and mixed (the MurmurHash3 finalizer), then 256 affine
maps `a * x + b mod 2^32` with odd `a`, and the minimum of each over the tokens. numpy does
that in one broadcast; the band keys mix each band's four minima with a 64-bit finalizer in
one more (64 blake2b calls a question before). A commit signs all its questions at once, and a
group commit the questions of several calls, whatever their chapters and languages:
`sign_many` and `band_keys_many` take the affine maps of all their tokens in one broadcast
and mix all their bands together (issue 33); `minhash` and `band_keys`, one text at a time,
stay as the reference the tests compare every key with (tests/unit/test_signing.py).

The number-word table is written by hand: the libraries that parse English numbers
(word2number, text2num) are unmaintained or pull in far more than twenty words need.
"""

from __future__ import annotations

import hashlib
import re
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache

from examforge.languages import DEFAULT_LANGUAGE
from examforge.neardup_lang import (EN_NUMBER_WORDS, EN_STOP_WORDS, RULES, Rules,
                                    fold_any, rules)
from examforge.output import canonical, normalise

# The LSH layout. Fixed, not derived from NEAR_DUP_THRESHOLD: the band keys are stored, and
# a threshold changed later must not make them stale. Changing these (or the normalisation,
# examforge.output.canonical) changes stored signatures: bump SIGNATURE_VERSION and add a
# migration that recomputes them (as 0013_normal_form does for version 2, the normal form).
BANDS = 64
ROWS = 4
NUM_PERM = BANDS * ROWS
SIGNATURE_VERSION = 3  # 3: per language (examforge.neardup_lang, migration 0032)
_SEED = 1

DEFAULT_THRESHOLD = 0.5
# The edit similarity at which two texts are near-duplicates whatever their Jaccard: above
# every pair to keep of the labelled set (at most 0.75 where no key term is swapped, 0.73
# between the mock's closest distinct questions), below what only it catches: one sentence
# in British and American spelling, or with typos (0.95-0.97, Jaccard 0.27-0.45: every
# spelling is another stem; tests/unit/test_neardup.py EDIT_ONLY_CATCH). Fixed, unlike
# NEAR_DUP_THRESHOLD, which sets the Jaccard's.
EDIT_THRESHOLD = 0.85


class Scope(str, Enum):
    """Where a new question is compared: its chapter, or every chapter of its exam."""

    chapter = "chapter"
    exam = "exam"


# Function words and the words every exam question is made of: they carry no subject.
# (English's, with the other languages' rules, in examforge.neardup_lang.)
STOP_WORDS = EN_STOP_WORDS

# "Which of the following ...", "Which one of these ...": what rephrasings add or drop.
_LEAD_IN_RE = RULES["en"].lead_in
assert _LEAD_IN_RE is not None
_NUMBER_WORDS = EN_NUMBER_WORDS
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")
_UNIT_RE = re.compile(r"(\d)([a-zA-Z%]+)")  # 250ms -> 250 ms, 5GB -> 5 GB, 20% -> 20 %
_WORD_RE = re.compile(r"[^\W_]+(?:\.\d+)?", re.UNICODE)
_NUMBER_RE = re.compile(r"^\d+(\.\d+)?$")
# An identifier as written: an acronym (HTTPS, SQL), a name with inner capitals (DynamoDB,
# CloudFront) or letters mixed with digits (EC2, S3, IPv6, HTTP2). Read before lower-casing.
# A name of letters and digits keeps a dotted suffix: "m5.large" and "m5.xlarge" differ.
# Its quantifiers are possessive (`++`, `*+`: never give back what they took), which finds
# the same identifiers with less backtracking (a third less time, measured): every match
# ends at a word boundary, and a run of letters and digits has none inside it, so giving
# back never made a match (tests/unit/test_signing.py pins the signatures of random texts).
_IDENT_RE = re.compile(r"\b(?:[A-Z]{2,}+[a-z]*+\d*+|[A-Za-z]++\d++[A-Za-z\d]*+(?:\.[a-z]+\b)?|"
                       r"[A-Z][a-z]++[A-Z]\w*+)\b")


_local = threading.local()


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """A word stemmed by the English rules."""
    return _stem_in(word, "english")


@lru_cache(maxsize=65536)
def _stem_in(word: str, algorithm: str) -> str:
    # A stemmer object keeps its word in itself while it works: one per thread and language
    # (a worker's threads commit at once; a shared one garbles stems, and with them the
    # stored keys).
    stemmers = getattr(_local, "stemmers", None)
    if stemmers is None:
        stemmers = _local.stemmers = {}
    stemmer = stemmers.get(algorithm)
    if stemmer is None:
        import snowballstemmer

        stemmer = stemmers[algorithm] = snowballstemmer.stemmer(algorithm)
    return str(stemmer.stemWord(word))


def _number(token: str) -> str:
    """One spelling for a number: '1.50' and '1.5', '007' and '7'."""
    value = float(token)
    return str(int(value)) if value.is_integer() else repr(value)


_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_UNITS = "one|two|three|four|five|six|seven|eight|nine"
# One pass over lower-cased text: "twenty-five" and "twenty five" (a compound) first, then
# any one number word. (Two IGNORECASE passes, compounds then words, took half of a
# signature's time.)
_NUMBER_WORD_RE = re.compile(rf"\b(?:({_TENS})[- ]({_UNITS})|("
                             + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
                             + r"))\b")


def _number_word(m: re.Match[str]) -> str:
    tens, unit, word = m.groups()
    return str(_NUMBER_WORDS[tens] + _NUMBER_WORDS[unit] if tens else _NUMBER_WORDS[word])


def _words_to_digits(text: str) -> str:
    """Number words as digits, in text already lower-cased."""
    return _NUMBER_WORD_RE.sub(_number_word, text)


@dataclass(frozen=True)
class Signature:
    """What near-duplicate detection compares of one question text."""

    tokens: frozenset[str]
    keys: frozenset[str]  # numbers and identifiers: the facts a question turns on
    # The whole text, lower-cased (examforge.output.normalise), for the edit similarity;
    # not stored with the signature (the question's own row has it).
    text: str = field(default="", compare=False)

    def encode(self) -> tuple[str, str]:
        """The stored form (two space-separated columns)."""
        return " ".join(sorted(self.tokens)), " ".join(sorted(self.keys))

    @classmethod
    def decode(cls, tokens: str, keys: str, text: str = "") -> Signature:
        return cls(frozenset(tokens.split()), frozenset(keys.split()), _edit_text(text))


def signature(text: str, context: str = "", language: str = DEFAULT_LANGUAGE) -> Signature:
    """The normalised content words and the key terms of a question text written in
    `language` (a tag of examforge.languages; its rules: examforge.neardup_lang). The words
    of `context` (the chapter's title, which most of its questions repeat) are left out:
    they say nothing about what one question asks that the others do not."""
    original = text
    rules_ = RULES["en"] if language == DEFAULT_LANGUAGE else rules(language)
    english = rules_ is RULES["en"]
    # The exact hash's normal form (NFKC, no format characters, single spaces), case kept:
    # a zero-width space inside "AWS" must not make "A" and "WS" of it.
    text = canonical(text)
    # The edit similarity's text: ASCII's is this normal form lower-cased (`_edit_text`).
    edit = text.lower() if original.isascii() else _edit_text(original)
    if not text.isascii():
        text = rules_.folder(text)  # text.translate(rules_.fold), faster
        for pattern, joined in rules_.rejoin:
            text = pattern.sub(joined, text)
    idents = {i.lower() for i in _IDENT_RE.findall(text)}
    if rules_.lead_in is not None:
        text = rules_.lead_in.sub(" ", text)
    for pattern, replacement in rules_.numerals:  # "10 000", "99,9" in Russian
        text = pattern.sub(replacement, text)
    if "," in text:  # what _THOUSANDS_RE removes
        text = _THOUSANDS_RE.sub("", text)
    text = text.lower()
    if english:
        text = _words_to_digits(text)
    elif rules_.number_re is not None:
        words = rules_.number_words
        text = rules_.number_re.sub(lambda m: str(words[m.group(0)]), text)
    text = _UNIT_RE.sub(r"\1 \2", text).replace("%", " percent ")
    stem = _stem
    tokens: set[str] = set()
    keys = set()
    for word in _WORD_RE.findall(text):
        # A number starts with a decimal digit (re's \d is str.isdecimal): most words are
        # ruled out without the pattern.
        if word[0].isdecimal() and _NUMBER_RE.match(word):
            word = _number(word)
            keys.add(word)
            tokens.add(word)
        elif english or word.isascii():
            if word not in STOP_WORDS:
                tokens.add(stem(word))
        else:
            token = _native(word, rules_)
            if token:
                tokens.add(token)
    keys |= {stem(i) for i in idents if i not in STOP_WORDS}
    if context:
        common = _context(context, language)
        tokens -= common.tokens
        keys -= common.keys
    return Signature(frozenset(tokens), frozenset(keys), edit)


def _native(word: str, rules_: Rules) -> str:
    """A word of the language's own script as its signature counts it: "" for a stop word,
    else its stem (or the word, for a language without a stemmer)."""
    for prefix in rules_.joined_prefixes:  # "والخادم": "و" + "الخادم"
        if word.startswith(prefix) and word[len(prefix):len(prefix) + 2] == "\u0627\u0644":
            word = word[len(prefix):]
    if word in rules_.stop_words:
        return ""
    if word in rules_.percent_words:
        return "percent"  # as "%" reads
    if rules_.stemmer is None:
        return word
    stemmed = _stem_in(word, rules_.stemmer)
    if stemmed in rules_.stop_stems:
        return ""
    return stemmed.replace("\u0629", "\u0647")  # a teh marbuta the stemmer left, as heh


def _edit_text(text: str) -> str:
    """The text the edit similarity compares: lower-cased normal form, every script's
    variants folded one way (examforge.neardup_lang.fold_any)."""
    if text.isascii():
        return normalise(text)
    return normalise(fold_any(text))


@lru_cache(maxsize=1024)
def _context(context: str, language: str = DEFAULT_LANGUAGE) -> Signature:
    """A chapter title's signature: the same for each of its questions."""
    return signature(context, language=language)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    shared = len(a & b)  # one set built, not two: this runs for every candidate
    return shared / (len(a) + len(b) - shared)


def swapped(a: Signature, b: Signature) -> bool:
    """Whether each has a key term the other lacks: a different fact asked in a like form."""
    return not a.keys <= b.keys and not b.keys <= a.keys  # no set built


def similarity(a: Signature, b: Signature) -> float:
    """How alike two questions are, 0..1; 0 when their key terms were swapped."""
    return 0.0 if swapped(a, b) else jaccard(a.tokens, b.tokens)


@lru_cache(maxsize=1)
def _ratio() -> Callable[..., float]:
    # Imported once, on first use (an import statement per candidate cost a tenth of it).
    from rapidfuzz import fuzz

    return fuzz.ratio  # type: ignore[no-any-return]


def edit_similarity(a: Signature, b: Signature) -> float:
    """rapidfuzz's normalised Indel similarity of the two whole texts, 0..1."""
    return float(_ratio()(a.text, b.text)) / 100 if a.text and b.text else 0.0


_EDIT_CUTOFF = round(EDIT_THRESHOLD * 100, 9)  # 0.85 * 100 is 85.00000000000001


def is_near(a: Signature, b: Signature, threshold: float = DEFAULT_THRESHOLD) -> bool:
    """Near-duplicates: their key terms not swapped, and either their content words alike
    (Jaccard at `threshold`: clauses moved, lead-ins and numbers rewritten) or their texts
    nearly the same in order (edit similarity at EDIT_THRESHOLD: a phrase or two swapped for
    synonyms in a sentence otherwise left as it was, which moves many words at once).

    Run for every candidate of every new question, so written for speed: the Jaccard's
    bound from the sets' sizes alone first (|A & B| <= min), and rapidfuzz told the cut-off,
    which lets it give up early (texts whose lengths alone rule it out cost nothing)."""
    if swapped(a, b):
        return False
    ta, tb = a.tokens, b.tokens
    la, lb = len(ta), len(tb)
    if la and lb and min(la, lb) >= threshold * max(la, lb) and \
            jaccard(ta, tb) >= threshold:
        return True
    if not la and not lb:
        return True
    if not a.text or not b.text:
        return False
    return bool(_ratio()(a.text, b.text, score_cutoff=_EDIT_CUTOFF))


@lru_cache(maxsize=1)
def _numpy():  # type: ignore[no-untyped-def]
    # Imported on first use: a CLI that never checks a question does not pay for numpy.
    import numpy as np

    return np


@lru_cache(maxsize=1)
def _affine():  # type: ignore[no-untyped-def]
    """The NUM_PERM affine maps (odd multipliers, offsets), fixed by _SEED."""
    np = _numpy()
    rng = np.random.default_rng(_SEED)
    a = rng.integers(0, 2**32, size=NUM_PERM, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**32, size=NUM_PERM, dtype=np.uint64)
    return a, b


@lru_cache(maxsize=1)
def _affine32():  # type: ignore[no-untyped-def]
    """`_affine` as uint32 arrays (every multiplier and offset is below 2^32)."""
    np = _numpy()
    a, b = _affine()
    return a.astype(np.uint32), b.astype(np.uint32)


_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF


def _hash32(data: bytes) -> int:
    return struct.unpack("<I", hashlib.blake2b(data, digest_size=4).digest())[0]


@lru_cache(maxsize=65536)
def _token_hash(token: str) -> int:
    """`_hash32` of a token's UTF-8: the same stems recur in every question of a chapter."""
    return _hash32(token.encode())


@lru_cache(maxsize=65536)
def _token_value(token: str) -> int:
    """A token's hash as the affine maps take it: `_hash32` of its UTF-8, mixed by `_fmix32`
    (here on one Python int, once per token: the same stems recur in every question of a
    chapter)."""
    h = _hash32(token.encode())
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def _fmix32(h):  # type: ignore[no-untyped-def]
    """MurmurHash3's 32-bit finalizer on an array of uint64 holding 32-bit values."""
    np = _numpy()
    m = np.uint64(_MASK32)
    h = h ^ (h >> np.uint64(16))
    h = (h * np.uint64(0x85EBCA6B)) & m
    h = h ^ (h >> np.uint64(13))
    h = (h * np.uint64(0xC2B2AE35)) & m
    return h ^ (h >> np.uint64(16))


def _fmix64(h):  # type: ignore[no-untyped-def]
    """MurmurHash3's 64-bit finalizer (uint64 arithmetic wraps: modulo 2^64)."""
    np = _numpy()
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def minhash(sig: Signature):  # type: ignore[no-untyped-def]
    """The NUM_PERM minima of a signature's tokens (uint64 array of 32-bit values)."""
    np = _numpy()
    a, b = _affine()
    tokens = sorted(sig.tokens)
    hv = _fmix32(np.fromiter((_token_hash(t) for t in tokens), dtype=np.uint64,
                             count=len(tokens)))
    return ((hv[:, None] * a + b) & np.uint64(_MASK32)).min(axis=0)


def estimate_jaccard(x: Signature, y: Signature) -> float:
    """The Jaccard similarity of two signatures as their minima estimate it (the share of
    equal minima): what the band keys are built on."""
    return float((minhash(x) == minhash(y)).mean())


@lru_cache(maxsize=1)
def _band_salts():  # type: ignore[no-untyped-def]
    # Mixed into each band's key, so equal minima in two bands never give one key.
    np = _numpy()
    return _fmix64(np.arange(1, BANDS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def band_keys(sig: Signature) -> list[int]:
    """The LSH band keys of a signature: BANDS non-negative 63-bit integers, one per band of
    ROWS minima (four 32-bit minima packed into two 64-bit words and mixed with the band's
    salt)."""
    if not sig.tokens:
        return []
    np = _numpy()
    rows = minhash(sig).reshape(BANDS, ROWS)
    low = rows[:, 0] | (rows[:, 1] << np.uint64(32))
    high = rows[:, 2] | (rows[:, 3] << np.uint64(32))
    keys = _fmix64(_fmix64(high ^ _band_salts()) ^ low) >> np.uint64(1)
    return [int(k) for k in keys.tolist()]


def band_keys_many(sigs: Sequence[Signature]) -> list[list[int]]:
    """`band_keys` of many signatures at once, whatever text, chapter or language each came
    from (a reply, or the replies of several calls committed together), in one vectorised
    pass: the tokens of all of them in one array of their mixed 32-bit hashes, the affine
    maps of all of them in one broadcast, each signature's minima reduced over its own tokens
    (one row each, or `np.minimum.reduceat` over runs when one text is much longer than the
    others), then the bands of all of them mixed at once. The same keys as `band_keys` one by
    one (tests/unit/test_signing.py compares them on every language's labelled pairs and on
    random texts), for a fixed number of numpy calls whatever the count.

    What makes it cheaper than `minhash` and `band_keys`, with the same numbers: each
    token's hash is cached already mixed (`_token_value`), so the array is built without a
    numpy pass of its own; the affine maps are taken in uint32, whose multiplication wraps modulo 2^32
    as the `& 0xFFFFFFFF` of the 64-bit product does (half the memory, one pass fewer); the
    tokens are not sorted (a minimum does not depend on the order); and the four 32-bit minima
    of a band are read as two little-endian 64-bit words by a view, not shifted and or-ed."""
    np = _numpy()
    out: list[list[int]] = [[] for _ in sigs]
    live = [i for i, sig in enumerate(sigs) if sig.tokens]
    if not live:
        return out
    a, b = _affine32()
    value = _token_value
    sizes = [len(sigs[i].tokens) for i in live]
    width = max(sizes)
    if len(live) * width <= 2 * sum(sizes):
        # Each signature's tokens in a row of its own, the shorter rows filled up with their
        # first token again (a repeat does not change a minimum): the minima are then one
        # reduction over the rows' axis, about 40 % cheaper than reduceat's runs.
        values: list[int] = []
        for i in live:
            row = [value(t) for t in sigs[i].tokens]
            values += row
            values += row[:1] * (width - len(row))
        hv = np.array(values, dtype=np.uint32).reshape(len(live), width, 1)
        maps = hv * a
        maps += b
        mins = maps.min(axis=1)
    else:  # one much longer text: filling the others up would cost more than it saves
        hv = np.fromiter((value(t) for i in live for t in sigs[i].tokens), dtype=np.uint32,
                         count=sum(sizes))
        maps = hv[:, None] * a
        maps += b
        starts = np.zeros(len(live), dtype=np.intp)
        np.cumsum(sizes[:-1], out=starts[1:])
        mins = np.minimum.reduceat(maps, starts, axis=0)
    # (signatures, BANDS, ROWS) uint32 as (signatures, BANDS, 2) uint64: low, high.
    words = mins.astype("<u4", copy=False).view("<u8").reshape(len(live), BANDS, 2)
    keys = _fmix64(_fmix64(words[:, :, 1] ^ _band_salts()) ^ words[:, :, 0]) >> np.uint64(1)
    for i, k in zip(live, keys.tolist()):
        out[i] = k
    return out


def sign_many(items: Iterable[tuple[str, str, str]]) -> list[tuple[Signature, list[int]]]:
    """The signature and band keys of each (text, context, language): `signature` of each
    text, then `band_keys_many` of all of them in one pass. What a commit stores for its
    questions (storage.neardup.Signed), for one reply or several calls' replies together."""
    sigs = [signature(text, context, language) for text, context, language in items]
    return list(zip(sigs, band_keys_many(sigs)))


def warm_up() -> None:
    """Load what checking a question loads on its first use (numpy, the stemmer, rapidfuzz):
    a worker calls it before its first claim, so that its first commit does not spend a
    fifth of a second importing them while it holds the slice (and, on SQLite, the write
    lock)."""
    band_keys_many([signature("Which of the following ports does SSH use, twenty-two?")])
    _ratio()


@dataclass(frozen=True)
class Checker:
    """The settings of one check: NEAR_DUP_THRESHOLD and NEAR_DUP_SCOPE."""

    threshold: float = DEFAULT_THRESHOLD
    scope: Scope = Scope.chapter

    def is_near(self, a: Signature, b: Signature) -> bool:
        return is_near(a, b, self.threshold)


def near_pairs(texts: Iterable[str], threshold: float = DEFAULT_THRESHOLD,
               context: str = "", language: str = DEFAULT_LANGUAGE) -> list[tuple[int, int]]:
    """Every near-duplicate pair (i, j) of `texts`, compared pairwise without band keys:
    what a check by index lookups must agree with (the tests compare them)."""
    sigs = [signature(t, context, language) for t in texts]
    return [(i, j) for i in range(len(sigs)) for j in range(i + 1, len(sigs))
            if is_near(sigs[i], sigs[j], threshold)]
