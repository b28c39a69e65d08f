"""Near-duplicates in every language examforge knows (issue 31): the labelled pairs of
tests/unit/neardup_pairs.py, each language's recall and false-positive rate (printed with
-s), and the normalisation steps of examforge/neardup_lang.py one by one."""

from __future__ import annotations

import pytest
from neardup_pairs import PAIRS, SWAPPED, TITLES
from test_neardup import MUST_CATCH, MUST_NOT_CATCH

from examforge import neardup as nd
from examforge.languages import LANGUAGES
from examforge.neardup_lang import RULES


def _rates(lang: str, rules_of: str) -> tuple[float, float, list[tuple[str, str]]]:
    """Recall on the paraphrases, false-positive rate on the distinct pairs, the misses."""
    catch, keep = PAIRS[lang]
    if lang == "en":
        catch, keep = catch + MUST_CATCH, keep + MUST_NOT_CATCH
    checker, title = nd.Checker(), TITLES[lang]

    def near(a: str, b: str) -> bool:
        return checker.is_near(nd.signature(a, title, rules_of), nd.signature(b, title, rules_of))

    missed = [(a, b) for a, b in catch if not near(a, b)]
    flagged = sum(near(a, b) for a, b in keep)
    return 1 - len(missed) / len(catch), flagged / len(keep), missed


@pytest.mark.parametrize("lang", sorted(PAIRS))
def test_each_language_catches_its_paraphrases_and_keeps_its_distinct_pairs(lang: str) -> None:
    catch, keep = PAIRS[lang]
    if lang == "en":  # with test_neardup.py's pairs
        catch, keep = catch + MUST_CATCH, keep + MUST_NOT_CATCH
    assert len(catch) >= 40 and len(keep) >= 40
    recall, fp_rate, missed = _rates(lang, lang)
    before, before_fp, _ = _rates(lang, "en")  # English's rules, as before issue 31
    swapped = SWAPPED[lang]
    title = TITLES[lang]
    limit = sum(nd.is_near(nd.signature(a, title, lang), nd.signature(b, title, lang))
                for a, b in swapped)
    print(f"\n{lang}: recall {recall:.1%} ({len(catch)} paraphrases), false positives "
          f"{fp_rate:.1%} ({len(keep)} distinct pairs); with English's rules {before:.1%} and "
          f"{before_fp:.1%}; one phrase swapped (the known limit) caught {limit} of "
          f"{len(swapped)}")
    assert recall >= 0.95, missed
    assert fp_rate == 0


def test_every_language_has_rules_and_a_stemmer() -> None:
    import snowballstemmer

    assert set(RULES) == set(LANGUAGES)
    for tag, rules in RULES.items():
        assert rules.stemmer in snowballstemmer.algorithms(), tag
        assert rules.stop_words and rules.lead_in is not None and rules.number_words, tag


def _same(a: str, b: str, lang: str) -> None:
    sa, sb = nd.signature(a, "", lang), nd.signature(b, "", lang)
    assert sa == sb, (sa, sb)


@pytest.mark.parametrize("lang,a,b", [
    # Persian retyped with the Arabic yeh and kaf (the issue's miss: similarity 0.36).
    ("fa", "کدام سرویس کش تأخیر خواندن از پایگاه داده را کم می‌کند؟",
     "كدام سرويس كش تأخير خواندن از پايگاه داده را كم مي‌كند؟"),
    # The ZWNJ, a space, or nothing between a word's parts.
    ("fa", "سرورها از کدام پورت پیش‌فرض استفاده می‌کنند؟",
     "سرور ها از کدام پورت پیشفرض استفاده می کنند؟"),
    ("fa", "نسخه‌های پشتیبان ۷ سال و ۹۹٫۹٪ دوام", "نسخه های پشتیبان 7 سال و 99.9% دوام"),
    # Arabic with diacritics, tatweel, hamza'd alefs and Arabic-Indic digits.
    ("ar", "أيُّ خدمةٍ تُخزِّن النسخ الاحتياطية لمدة ٧ سنوات؟",
     "ايـــ خدمة تخزن النسخ الاحتياطية لمدة 7 سنوات؟".replace("ايـــ", "أي")),
    ("ar", "ما الذي يحسنه إصدار TLS ١٫٣ بنسبة ١٠٪؟", "ما الذي يحسنه اصدار TLS 1.3 بنسبة 10%؟"),
    # Russian ё written as е, and its numbers ("10 000", "99,9").
    ("ru", "Что произойдёт с учётной записью?", "Что произойдет с учетной записью?"),
    ("ru", "10 000 запросов при 99,9% доступности", "10000 запросов при 99.9 процента доступности"),
])
def test_variants_of_one_text_have_one_signature(lang: str, a: str, b: str) -> None:
    _same(a, b, lang)


def test_the_edit_similarity_reads_letter_variants_as_one() -> None:
    """The edit path compares texts folded one way whatever their language: a Persian
    question retyped with Arabic letters, diacritics and other digits is the same text."""
    a = nd.signature("پورت پیش‌فرض HTTPS در سال ۲۰۲۴ کدام است؟", "", "fa")
    b = nd.signature("پورت پيش‌فرض HTTPS در سال 2024 كدام است؟", "", "ar")  # any language
    assert a.text == b.text
    assert nd.Signature.decode(*a.encode(), "پورت پيش‌فرض HTTPS در سال 2024 كدام است؟").text \
        == a.text


def test_the_issue_s_misses_are_caught() -> None:
    checker = nd.Checker()

    def near(a: str, b: str, lang: str) -> bool:
        return checker.is_near(nd.signature(a, "", lang), nd.signature(b, "", lang))

    # A Russian verb in another form (истечении, истекает).
    assert near("Что происходит с сессией при истечении срока действия токена?",
                "Что происходит с сессией, когда срок действия токена истекает?", "ru")
    # An Arabic sentence reordered, with an inflected noun (الخوادم, خادم).
    assert near("أي خدمة من AWS تتيح تشغيل الشيفرة دون إدارة الخوادم؟",
                "دون إدارة خادم، أي خدمة من AWS تتيح تشغيل الشيفرة؟", "ar")
    # And two facts stay apart in every script: another number, in other digits.
    assert not near("نسخه‌ها را ۷ سال نگه دارید", "نسخه‌ها را 30 سال نگه دارید", "fa")


def test_the_stored_text_is_never_folded() -> None:
    """Folding is for matching: the signature's tokens are folded, the question is not."""
    text = "كدام سرويس؟ ۷"
    sig = nd.signature(text, "", "fa")
    assert "سرویس" in sig.tokens and "7" in sig.keys
    assert text == "كدام سرويس؟ ۷"


def test_english_signatures_are_as_they_were() -> None:
    """English keeps its rules: the language argument's default is English, and English text
    signs the same through it."""
    text = "Which of the following ports does SSH use, twenty-two?"
    assert nd.signature(text) == nd.signature(text, "", "en")
    assert nd.signature(text).tokens == {"ssh", "use", "22", "port"}


def test_a_latin_term_inside_another_language_is_stemmed_as_english() -> None:
    a = nd.signature("کدام سرویس backups را نگه می‌دارد؟", "", "fa")
    b = nd.signature("کدام سرویس backup را نگه می‌دارد؟", "", "fa")
    assert a.tokens == b.tokens


def test_context_is_left_out_in_the_chapter_s_language() -> None:
    sig = nd.signature("مفاهیم ابری: کدام سرویس کش تأخیر را کم می‌کند؟", "مفاهیم ابری", "fa")
    assert not {"مفاهیم", "ابر", "ابری"} & sig.tokens
