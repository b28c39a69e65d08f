"""How a question's words are normalised for its near-duplicate signature, per language
(examforge.neardup): the letter folding, the stemmer, the stop words, the question lead-ins
and the number words of each language examforge knows (examforge.languages).

The steps, in order (examforge.neardup.signature runs them):
1. The Unicode normal form (examforge.output.canonical: NFKC, format characters dropped,
   spaces collapsed), which joins the parts of a Persian word written with the zero-width
   non-joiner (می‌کند as میکند, سرور‌ها as سرورها, پیش‌فرض as پیشفرض).
2. `fold`: each script's letter variants and optional marks, never in stored text:
   - Arabic diacritics (harakat U+064B-U+065F, the superscript alef U+0670, Quranic marks)
     and the tatweel U+0640 dropped;
   - the alef forms أ إ آ ٱ as the bare alef ا;
   - yeh and kaf as the language writes them: in Persian (and any other language) the
     Arabic ي ى and ك as ی and ک; in Arabic the Persian ی and ک as ي and ك, and the alef
     maqsura ى as ي, the forms Snowball's Arabic stemmer reads;
   - teh marbuta: in Persian ة and ۀ as ه (Persian writes ه); in Arabic ة is kept for the
     stemmer, which strips it as the feminine ending (a ه written for it is not folded: it
     would merge the pronoun suffix ـه, "its", with the ending);
   - hamza seats in Persian: ؤ as و and ئ as ی (مسئول, مسؤول; پائیز, پاییز);
   - Russian ё as е;
   - the digits of every script (Persian ۰-۹, Arabic-Indic ٠-٩) as ASCII, and the Arabic
     decimal and thousands separators and percent sign (٫ ٬ ٪) as . , %.
3. Persian only: the same parts written apart with a space are joined too (the verb prefixes
   می and نمی to the word after, the suffixes ها, های, هایی, ای, ی, تر, ترین to the word
   before), so a word reads the same with a ZWNJ, a space or nothing between its parts; the
   stemmer then takes the plural and comparative suffixes off.
4. Lead-ins ("Which of the following", "کدام یک از موارد زیر", "أي مما يلي", "Какой из
   следующих") dropped, number words written as digits, then each word: a stop word dropped,
   any other stemmed by Snowball's stemmer for the language (the `snowballstemmer` package
   ships English, Russian, Arabic and Persian); a Latin word inside another language's text
   (a product name, "DNS") by the English rules. A language without a stemmer would keep its
   words in the normal form (none of the four lacks one).

Why the stop-word lists are written here and not taken from a package (stopwords-iso,
NLTK's corpus): those lists are for search and hold hundreds of words, content words among
them (stopwords-iso's Persian list has "سرور"-like nouns such as "کار" and "نوع"), and the
useful ones here are the words every exam question is made of ("گزینه", "صحیح", "является",
"التالية"), which no general list has. NLTK's also needs a download. Each list is short and
written for exam questions, as the English one has been from the start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

from examforge.languages import DEFAULT_LANGUAGE

ZWNJ = "\u200c"

_MARKS = {cp: None for cp in (0x0640, 0x0670, *range(0x064B, 0x0660), *range(0x06D6, 0x06EE))}
_DIGITS = {**{0x06F0 + i: str(i) for i in range(10)}, **{0x0660 + i: str(i) for i in range(10)},
           ord("\u066b"): ".", ord("\u066c"): ",", ord("\u066a"): "%"}
_ALEFS = {ord(c): "\u0627" for c in "\u0623\u0625\u0622\u0671"}
_COMMON: dict[int, str | None] = {**_MARKS, **_DIGITS, **_ALEFS, ord("ё"): "е", ord("Ё"): "Е"}
# Persian forms of yeh and kaf (and for any language but Arabic: the edit similarity's form).
_PERSIAN: dict[int, str | None] = {
    **_COMMON, ord("\u064a"): "\u06cc", ord("\u0649"): "\u06cc", ord("\u0643"): "\u06a9",
    ord("\u0629"): "\u0647", ord("\u06c0"): "\u0647", ord("\u0624"): "\u0648",
    ord("\u0626"): "\u06cc"}
_ARABIC: dict[int, str | None] = {
    **_COMMON, ord("\u06cc"): "\u064a", ord("\u0649"): "\u064a", ord("\u06a9"): "\u0643",
    ord("\u06c0"): "\u0647"}


def translator(table: dict[int, str | None]) -> Callable[[str], str]:
    """`str.translate(table)` as a function, faster on the texts signatures read: one
    pattern of the table's characters finds those the text holds (a scan in C) and each is
    replaced by its value, where `translate` looks every character of the text up in the
    dict (about 50-90 ns a character: 8-15 µs for a 160-character Persian question, twice a
    signature). The same result: each key character becomes its value, every other one stays
    (tests/unit/test_signing.py compares them)."""
    into = {chr(cp): value or "" for cp, value in table.items()}
    if not into:
        return str  # nothing to translate (a class of no characters is no pattern)
    pattern = re.compile("[" + "".join(map(re.escape, sorted(into))) + "]")

    def translate(text: str) -> str:
        return pattern.sub(lambda m: into[m.group()], text)

    return translate


def fold_any(text: str) -> str:
    """`text` with every script's variants folded one way, whatever its language (the
    Persian yeh and kaf, no diacritics, ASCII digits, е for ё): the text the edit similarity
    compares, the same for a question and the stored ones it meets."""
    return _fold_any(text)


@dataclass(frozen=True)
class Rules:
    """What normalising one language's words needs."""

    stemmer: str | None  # a snowballstemmer algorithm, or None: words kept as folded
    stop_words: frozenset[str]  # folded as the text is
    lead_in: re.Pattern[str] | None  # matched on the folded, cased text
    number_words: dict[str, int]
    fold: dict[int, str | None]
    # Words the same but for a conjunction written joined to them (Arabic و).
    joined_prefixes: tuple[str, ...] = ()
    # Applied to the folded text: parts of one word written apart, joined (Persian).
    rejoin: tuple[tuple[re.Pattern[str], str], ...] = ()
    # Applied before English's thousands commas: how the language writes its numbers
    # (Russian: "10 000" and "99,9"; Persian: "۹۹/۹").
    numerals: tuple[tuple[re.Pattern[str], str], ...] = ()
    # The words for "percent", which read as "%" does.
    percent_words: frozenset[str] = frozenset()

    @cached_property
    def folder(self) -> Callable[[str], str]:
        """`fold` as a function (`translator`)."""
        return translator(self.fold)

    @cached_property
    def number_re(self) -> re.Pattern[str] | None:
        """Any one of its number words, as a whole word (in lower-cased, folded text)."""
        words = sorted(self.number_words, key=len, reverse=True)
        return (re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, words)) + r")(?!\w)")
                if words else None)

    @cached_property
    def stop_stems(self) -> frozenset[str]:
        """Its stop words as the stemmer leaves them: a stop word with a clitic joined to it
        ("والتي") is caught once stemmed. (Not for English, whose rules are as they were.)"""
        if self.stemmer is None or self.stemmer == "english":
            return frozenset()
        import snowballstemmer

        stem = snowballstemmer.stemmer(self.stemmer).stemWord
        return frozenset(stem(w) for w in self.stop_words)


_fold_any = translator(_PERSIAN)


def _folded(words: Iterable[str], table: dict[int, str | None]) -> frozenset[str]:
    return frozenset(w.replace(ZWNJ, "").translate(table).lower() for w in words)


def _numbers(pairs: dict[str, int], table: dict[int, str | None]) -> dict[str, int]:
    return {w.translate(table).lower(): n for w, n in pairs.items()}


_RU_STOP = """
и в во не на с со к ко о об обо от до по из за для при без над под про через между перед
после а но или либо ли же бы как что чтобы это этот эта эти этого этой этих этим этому тот
та те то того той тех такой такая такое такие он она оно они его ее их ему ей им мы вы я ты
наш наша наше наши ваш ваша свой своих свои своего своей своим себя который которая которое
которые которого которой которых которым какой какая какое какие какого каким какую каких
каком какому каков какова каковы чем чему кто кого где когда почему зачем есть быть был
была было были будет будут является являются являлся лучше лучший лучшим лучшая лучшее
лучшей наиболее самый самая самое самые самым следующий следующих следующее следующие
следующая следующим перечисленных перечисленного перечисленное перечисленные ниже выше
приведенных приведенные вариант варианты вариантов варианта ответ ответа ответов утверждение
утверждений утверждения верно верный верное верная верным правильный правильно правильное
правильная правильным вопрос все всех весь вся всего всем только также тоже уже еще очень
более менее можно нужно следует должен должна должно должны может могут ни нет да у так там
тут здесь если то описывает описание
"""

_FA_STOP = """
و در به از که این آن را با برای است هست نیست بود باشد باشند هستند می نمی ها های ی ای یک
یا اگر تا بر هم نیز چه چرا چگونه چطور کجا کی کدام کدامیک کدام‌یک کدامین گزینه گزینه‌ها
گزینه‌های گزینه‌ی مورد موارد زیر بالا فوق درست صحیح بهترین بهتر شود شده شد شوند کند کنند
کرد کرده کنید کرده‌است باید میتوان توان چیست کیست آیا خود آنها او ما شما من همه هر بین پس
قبل بعد بیشتر فقط دارد دارند داشته اند ام ست عبارت عبارات توصیف میکند میکنند میشود میشوند
نمیشود نمیکند میتوان میباشد میباشند شدهاست کردهاست
"""

_AR_STOP = """
في من إلى الى على عن مع و أو او ثم أن ان إن كان كانت يكون تكون هو هي هم هما هذا هذه ذلك
تلك التي الذي الذين ما ماذا لماذا كيف متى أين أي ايهما مما يلي التالي التالية الآتي الآتية
الخيارات الخيار خيار الإجابات الإجابة إجابة الصحيح الصحيحة صحيح صحيحة أفضل الأفضل أكثر
الأكثر هل لا لم لن قد كل جميع بعض كما عند عندما بين قبل بعد حتى إذا لكي كي يجب ينبغي يمكن
لدى له لها لهم به بها فيه فيها منه منها عليه عليها كذلك أيضا فقط خلال حول يتم تم العبارات
العبارة عبارة يصف
"""

_EN_LEAD_IN = re.compile(
    r"^\s*(which|what)\s+(one\s+)?(of\s+)?(the\s+)?(following|these|those|listed|below)"
    r"(\s+(options|choices|statements|answers))?\s*(is|are|would|best|most)?\b",
    re.IGNORECASE)

EN_STOP_WORDS = frozenset(["a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "one", "following", "option", "options", "choice", "choices", "statement", "statements", "best", "describe", "describes", "true", "correct", "question", "given", "listed"])  # noqa: E501

EN_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "million": 1_000_000, "dozen": 12, "twice": 2, "double": 2,
}

# Russian number words in the cases a question puts them in ("за семь дней", "семи дней").
_RU_NUMBERS = {
    "один": 1, "одна": 1, "одно": 1, "одного": 1, "одной": 1, "одну": 1, "одном": 1,
    "два": 2, "две": 2, "двух": 2, "три": 3, "трех": 3, "четыре": 4, "четырех": 4, "пять": 5,
    "пяти": 5, "шесть": 6, "шести": 6, "семь": 7, "семи": 7, "восемь": 8, "восьми": 8,
    "девять": 9, "девяти": 9, "десять": 10, "десяти": 10, "двенадцать": 12, "двенадцати": 12,
    "двадцать": 20, "двадцати": 20, "тридцать": 30, "тридцати": 30, "сто": 100, "ста": 100,
    "тысяча": 1000, "тысячи": 1000, "тысяч": 1000}
# Persian: not نه (also "no"). یک is also the indefinite article, as "one" is in English.
_FA_NUMBERS = {
    "یک": 1, "دو": 2, "سه": 3, "چهار": 4, "پنج": 5, "شش": 6, "هفت": 7, "هشت": 8, "ده": 10,
    "دوازده": 12, "بیست": 20, "سی": 30, "صد": 100, "هزار": 1000}
_AR_NUMBERS = {
    "واحد": 1, "واحدة": 1, "اثنان": 2, "اثنين": 2, "ثلاثة": 3, "ثلاث": 3, "أربعة": 4, "أربع": 4, "خمسة": 5, "خمس": 5,
    "ستة": 6, "سبعة": 7, "سبع": 7, "ثمانية": 8, "تسعة": 9, "تسع": 9, "عشرة": 10,
    "عشرون": 20, "عشرين": 20, "ثلاثون": 30, "ثلاثين": 30, "مائة": 100, "مئة": 100,
    "ألف": 1000, "آلاف": 1000}

RULES: dict[str, Rules] = {
    "en": Rules("english", EN_STOP_WORDS, _EN_LEAD_IN, EN_NUMBER_WORDS, _PERSIAN),
    "ru": Rules(
        "russian", _folded(_RU_STOP.split(), _PERSIAN),
        re.compile(r"^\s*(?:какой|какая|какое|какие|что)\s+из\s+(?:следующих|перечисленных|"
                   r"нижеперечисленных|приведенных(?:\s+ниже)?)(?:\s+(?:вариантов|утверждений|"
                   r"ответов))?", re.IGNORECASE),
        _numbers(_RU_NUMBERS, _PERSIAN), _PERSIAN,
        numerals=((re.compile(r"(?<=\d) (?=\d{3}(?!\d))"), ""),  # a space between thousands
                  (re.compile(r"(?<=\d),(?=\d)"), ".")),  # the decimal comma
        percent_words=frozenset({"процент", "процента", "процентов", "процентах"})),
    "fa": Rules(
        "persian", _folded(_FA_STOP.split(), _PERSIAN),
        re.compile("^\\s*" + "کدام ?یک از (?:موارد|گزینه ?های|عبارات) (?:زیر|فوق)"
                   .translate(_PERSIAN)),
        _numbers(_FA_NUMBERS, _PERSIAN), _PERSIAN,
        rejoin=((re.compile(r"(?<!\w)(ن?می) (?=\w)"), r"\1"),
                (re.compile(r"(?<=\w) (هایی|های|ها|ای|ی|ترین|تر)(?!\w)"), r"\1")),
        numerals=((re.compile(r"(?<=\d)/(?=\d)"), "."),),  # ۹۹/۹: the slash as a decimal point
        percent_words=_folded(("درصد",), _PERSIAN)),
    "ar": Rules(
        "arabic", _folded(_AR_STOP.split(), _ARABIC),
        re.compile("^\\s*" + "(?:أي|ما) (?:مما يلي|من (?:الخيارات|العبارات|الإجابات) "
                   "(?:التالية|الآتية))".translate(_ARABIC)),
        _numbers(_AR_NUMBERS, _ARABIC), _ARABIC, joined_prefixes=("و",),
        percent_words=_folded(("بالمئة", "بالمائة", "المئة", "المائة"), _ARABIC)),
}


def rules(tag: str | None) -> Rules:
    """A language's rules (None: the default's); a tag without any: the normal form only."""
    found = RULES.get(tag or DEFAULT_LANGUAGE)
    if found is None:
        return Rules(None, frozenset(), None, {}, _PERSIAN)
    return found
