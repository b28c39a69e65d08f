"""The commit's signing step, per question, before and after issue 33's group step: what
`storage.neardup.Signed.many` costs for replies of 1, 5, 20 and 100 questions.

    python -m bench.signing                     # the table, about 20 s
    python -m bench.signing --profile-loop 30   # signs replies of 20 for 30 s (for py-spy)
    py-spy record -f raw -o /tmp/sign.txt -- python -m bench.signing --profile-loop 30 --size 5

The variants, measured in interleaved rounds of one process (the order shuffled each round),
each on texts it has not signed before (the mock's questions, as a worker receives them; the
stems and token hashes of the chapter's words cached, as in a worker that has run a while):

- `per text`: `signature` and `band_keys` of each question, the per-text reference (what
  `Signed.of` did, and what imports did for every question);
- `before`: the commit's path before issue 33: `signature` of each question, then
  `band_keys_many` of the reply (issue 19's pass), both kept below as they were;
- `after`: `Signed.many` now, `examforge.neardup.sign_many`;
- `before, tokens only`, `after, tokens only` and `after, keys only`: the halves apart
  (`signature` of each text, the Python tokeniser; `band_keys_many` of the signatures, the
  numpy step).

The neardup part (`python -m bench --only neardup`) runs it and reports the ratios.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

SIZES = (1, 5, 20, 100)
TITLE = "Cloud Concepts"
TITLES = {"en": TITLE, "fa": "ذخیره‌سازی", "ar": "التخزين", "ru": "Хранение"}


def _band_keys_many_before(sigs: Sequence[Any]) -> list[list[int]]:
    """examforge.neardup.band_keys_many as it was before issue 33 (commit 154255e), verbatim
    but for the module's names: the baseline of this benchmark."""
    from examforge import neardup as nd

    np = nd._numpy()
    lists = [sorted(sig.tokens) for sig in sigs]
    sizes = [len(t) for t in lists]
    live = [i for i, n in enumerate(sizes) if n]
    out: list[list[int]] = [[] for _ in sigs]
    if not live:
        return out
    a, b = nd._affine()
    hv = nd._fmix32(np.fromiter((nd._token_hash(t) for i in live for t in lists[i]),
                                dtype=np.uint64, count=sum(sizes[i] for i in live)))
    starts = np.cumsum([0] + [sizes[i] for i in live[:-1]])
    mins = np.minimum.reduceat((hv[:, None] * a + b) & np.uint64(nd._MASK32), starts, axis=0)
    rows = mins.reshape(len(live), nd.BANDS, nd.ROWS)
    low = rows[:, :, 0] | (rows[:, :, 1] << np.uint64(32))
    high = rows[:, :, 2] | (rows[:, :, 3] << np.uint64(32))
    keys = nd._fmix64(nd._fmix64(high ^ nd._band_salts()) ^ low) >> np.uint64(1)
    for i, k in zip(live, keys.tolist()):
        out[i] = k
    return out


_IDENT_RE_BEFORE = re.compile(r"\b(?:[A-Z]{2,}[a-z]*\d*|[A-Za-z]+\d+[A-Za-z\d]*(?:\.[a-z]+\b)?|"
                              r"[A-Z][a-z]+[A-Z]\w*)\b")


def _signature_before(text: str, context: str = "", language: str = "en") -> Any:
    """examforge.neardup.signature as it was before issue 33 (commit 154255e), verbatim but
    for the module's names: the baseline's tokeniser."""
    from examforge import neardup as nd
    from examforge.neardup_lang import _PERSIAN, RULES, rules
    from examforge.output import canonical, normalise

    original = text
    rules_ = RULES["en"] if language == "en" else rules(language)
    english = rules_ is RULES["en"]
    text = canonical(text)
    if not text.isascii():
        text = text.translate(rules_.fold)
        for pattern, joined in rules_.rejoin:
            text = pattern.sub(joined, text)
    idents = {m.group(0).lower() for m in _IDENT_RE_BEFORE.finditer(text)}
    if rules_.lead_in is not None:
        text = rules_.lead_in.sub(" ", text)
    for pattern, replacement in rules_.numerals:
        text = pattern.sub(replacement, text)
    text = nd._THOUSANDS_RE.sub("", text).lower()
    if english:
        text = nd._words_to_digits(text)
    elif rules_.number_re is not None:
        words = rules_.number_words
        text = rules_.number_re.sub(lambda m: str(words[m.group(0)]), text)
    text = nd._UNIT_RE.sub(r"\1 \2", text).replace("%", " percent ")
    stem = nd._stem
    tokens: set[str] = set()
    keys = set()
    for word in nd._WORD_RE.findall(text):
        if nd._NUMBER_RE.match(word):
            word = nd._number(word)
            keys.add(word)
            tokens.add(word)
        elif english or word.isascii():
            if word not in nd.STOP_WORDS:
                tokens.add(stem(word))
        else:
            token = nd._native(word, rules_)
            if token:
                tokens.add(token)
    keys |= {stem(i) for i in idents if i not in nd.STOP_WORDS}
    if context:
        common = nd._context(context, language)
        tokens -= common.tokens
        keys -= common.keys
    edit = (normalise(original) if original.isascii()  # _edit_text as it was
            else normalise(original.translate(_PERSIAN)))
    return nd.Signature(frozenset(tokens), frozenset(keys), edit)


def variants() -> dict[str, Callable[[list[str], str, str], Any]]:
    from examforge import neardup as nd
    from storage.neardup import Signed

    def per_text(texts: list[str], title: str, lang: str) -> Any:
        out = []
        for t in texts:
            sig = _signature_before(t, title, lang)
            out.append((sig, tuple(nd.band_keys(sig))))
        return out

    def before(texts: list[str], title: str, lang: str) -> Any:
        sigs = [_signature_before(t, title, lang) for t in texts]
        return [(s, tuple(k)) for s, k in zip(sigs, _band_keys_many_before(sigs))]

    def before_tokens(texts: list[str], title: str, lang: str) -> Any:
        return [_signature_before(t, title, lang) for t in texts]

    def after(texts: list[str], title: str, lang: str) -> Any:
        return Signed.many(texts, title, lang)

    def tokens_only(texts: list[str], title: str, lang: str) -> Any:
        return [nd.signature(t, title, lang) for t in texts]

    return {"per text": per_text, "before": before, "before, tokens only": before_tokens,
            "after": after, "after, tokens only": tokens_only}


def texts_for(lang: str, start: int, n: int) -> list[str]:
    """Questions `start` .. `start + n - 1` of one chapter written by the mock."""
    if lang == "en":
        from mockllm import questions as mq

        return [mq.make_question("bench/sign", TITLE, s)["question"]
                for s in range(start, start + n)]
    from mockllm import corpora

    return [corpora.make_question(lang, "bench/sign", TITLES[lang], s)["question"]
            for s in range(start, start + n)]


def measure(sizes: Sequence[int] = SIZES, questions: int = 3000, lang: str = "en",
            seed: int = 0) -> dict[int, dict[str, float]]:
    """Median µs per question of each variant (and of the keys alone) for each reply size,
    over `questions // size` interleaved rounds: CPU time of the signing thread
    (`time.thread_time`), not wall time, so that the other work of a shared machine does not
    count (it still slows the caches)."""
    from examforge import neardup as nd

    runs = variants()
    title = TITLES[lang]
    # Warm: imports, the chapter's stems and token hashes, the affine maps.
    warm = texts_for(lang, 100_000, 300)
    for fn in runs.values():
        fn(warm, title, lang)
    rng = random.Random(seed)
    out: dict[int, dict[str, float]] = {}
    serial = 1
    for size in sizes:
        times: dict[str, list[float]] = {name: [] for name in (*runs, "after, keys only")}
        for _ in range(max(5, questions // size)):
            order = list(runs)
            rng.shuffle(order)
            for name in order:
                texts = texts_for(lang, serial, size)  # new texts for each variant
                serial += size
                t0 = time.thread_time()
                runs[name](texts, title, lang)
                times[name].append((time.thread_time() - t0) / size)
            sigs = [nd.signature(t, title, lang) for t in texts_for(lang, serial, size)]
            serial += size
            t0 = time.thread_time()
            nd.band_keys_many(sigs)
            times["after, keys only"].append((time.thread_time() - t0) / size)
        out[size] = {name: statistics.median(v) * 1e6 for name, v in times.items()}
    return out


def profile_loop(seconds: float, size: int = 20, lang: str = "en") -> int:
    """Sign new replies of `size` for `seconds` (what `py-spy record` samples)."""
    from storage.neardup import Signed

    Signed.many(texts_for(lang, 100_000, 300), TITLES[lang], lang)
    end = time.monotonic() + seconds
    serial, n = 1, 0
    while time.monotonic() < end:
        Signed.many(texts_for(lang, serial, size), TITLES[lang], lang)
        serial += size
        n += size
    return n


def report(results: dict[int, dict[str, float]]) -> list[str]:
    names = ("per text", "before", "after", "before, tokens only", "after, tokens only",
             "after, keys only")
    lines = ["| questions a reply | " + " | ".join(names) + " | after / before |",
             "|---" * (len(names) + 2) + "|"]
    for size, got in results.items():
        lines.append(f"| {size} | " + " | ".join(f"{got[n]:.1f}" for n in names)
                     + f" | {got['after'] / got['before']:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.signing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=3000,
                        help="questions signed per variant and reply size (default 3000)")
    parser.add_argument("--language", default="en", choices=sorted(TITLES))
    parser.add_argument("--profile-loop", type=float, metavar="SECONDS",
                        help="only sign replies for SECONDS (to run under py-spy)")
    parser.add_argument("--size", type=int, default=20,
                        help="questions a reply in --profile-loop (default 20)")
    args = parser.parse_args(argv)
    if args.profile_loop:
        n = profile_loop(args.profile_loop, args.size, args.language)
        print(f"signed {n} questions in replies of {args.size}")
        return 0
    print("\n".join(report(measure(questions=args.questions, lang=args.language))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
