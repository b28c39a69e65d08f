"""What an exam will cost before anything is sent: `enqueue SLUG --dry-run`.

The calls are the ones the pipeline would make (each chapter's missing questions, in batches
of QUESTIONS_PER_CALL), and each call's prompt is built by the same code and counted by the
same tokenizer as a real call, including its "do not repeat" list. The completion has two
figures: the worst case (every call uses all of its max_tokens: what the budget reserves) and
an expectation from the completion tokens per question this database has already seen (or
DEFAULT_COMPLETION_PER_QUESTION before it has seen any). Both assume every reply is complete;
re-asks after invalid or short replies add calls. With VERIFY, each call's blind solve is
counted too (`Solves`), and the totals include it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from examforge import verify
from examforge import verify as verify_mod
from examforge.levels import ask_types
from examforge.prices import Price
from examforge.prompt import build_messages
from examforge.sizing import fixed_allowance
from examforge.sources import Passage, slice_material, slice_passages
from examforge.settings import Settings
from examforge.syllabus import Syllabus, slice_ranges
from examforge.tokens import count_messages, count_text, encoding_name, reserve_prompt_tokens

# Completion tokens of one multiple-choice question with its explanation, as JSON, when no
# call has been seen yet (English; scripts the tokenizer splits finely take two or three times).
DEFAULT_COMPLETION_PER_QUESTION = 150
# A stand-in for a question not generated yet, in the "do not repeat" list of later calls:
# a typical exam question, about 30 tokens (the mean length of stored questions replaces it
# once the database has some).
_PLACEHOLDER = ("A team is moving a busy service to managed infrastructure this quarter; which "
                "of the following choices best protects its availability while keeping the "
                "running cost predictable?")


# A solve's reply per question, {"n": 1, "choice": "B"}, in tokens.
EXPECTED_ANSWER_TOKENS = 10
# Four typical choices, for a blind solve's prompt (examforge.verify).
_CHOICES = ("Review the configuration against the documented baseline every quarter",
            "Leave the default settings as they are and revisit them only after an outage",
            "Grant every team administrator rights so that nobody is blocked",
            "Disable the monitoring alerts that fire most often to reduce the noise")


def _placeholder(samples: list[str]) -> str:
    if not samples:
        return _PLACEHOLDER
    length = round(sum(map(len, samples)) / len(samples))
    return (_PLACEHOLDER * (length // len(_PLACEHOLDER) + 1))[:length]


@dataclass
class ChapterEstimate:
    chapter_id: str
    stored: int
    target: int
    calls: int = 0
    prompt_tokens: int = 0
    max_completion_tokens: int = 0


# One reply item of each type (examforge.item_types) as a model writes it, with the same
# question and explanation: their token counts set each type's completion tokens relative
# to an mcq's (the observed or default figure per question is an mcq's; a true/false item
# has no choices, a multi has five or six). Counted with the exam's tokenizer.
_EXPLANATION = ("Reviewing against the documented baseline catches drift early; the other "
                "options leave the service exposed or hide the problems that matter.")
_TYPE_SAMPLES: dict[str, dict[str, object]] = {
    "mcq": {"type": "mcq", "question": _PLACEHOLDER, "choices": list(_CHOICES),
            "answer_index": 0, "explanation": _EXPLANATION},
    "multi": {"type": "multi", "question": _PLACEHOLDER,
              "choices": [*_CHOICES, _CHOICES[0].replace("quarter", "month")],
              "correct": [0, 4], "explanation": _EXPLANATION},
    "truefalse": {"type": "truefalse", "question": _PLACEHOLDER, "answer": True,
                  "explanation": _EXPLANATION},
    "short": {"type": "short", "question": _PLACEHOLDER,
              "accepted": ["a documented baseline review", "baseline review"],
              "explanation": _EXPLANATION},
    "numeric": {"type": "numeric", "question": _PLACEHOLDER, "value": 99.95,
                "tolerance": 0.01, "relative": False, "unit": "%",
                "explanation": _EXPLANATION},
}


# The choices a blind solve shows of each type's placeholder.
_TYPE_CHOICES: dict[str, tuple[str, ...]] = {
    "mcq": _CHOICES, "multi": (*_CHOICES, _CHOICES[0].replace("quarter", "month"))}


def type_weights(model: str) -> dict[str, float]:
    """Each item type's completion tokens per question relative to an mcq's."""
    import json

    tokens = {k: count_text(json.dumps(v), model) for k, v in _TYPE_SAMPLES.items()}
    return {k: n / tokens["mcq"] for k, n in tokens.items()}


@dataclass
class TypeEstimate:
    """The share of an exam's generation cost that goes to one item type: each call's
    prompt and max_tokens split over the types it asks for by their counts, and the
    expected completion by each type's tokens per question (`type_weights`)."""

    type: str
    questions: int = 0
    prompt_tokens: float = 0.0
    max_completion_tokens: float = 0.0
    expected_completion_tokens: float = 0.0

    def as_dict(self, price: Price, worst: Price) -> dict[str, object]:
        return {"type": self.type, "questions": self.questions,
                "prompt_tokens": round(self.prompt_tokens),
                "max_completion_tokens": round(self.max_completion_tokens),
                "expected_completion_tokens": round(self.expected_completion_tokens),
                "worst_usd": round(worst.cost_usd(round(self.prompt_tokens),
                                                  round(self.max_completion_tokens)), 6),
                "expected_usd": round(price.cost_usd(
                    round(self.prompt_tokens), round(self.expected_completion_tokens)), 6)}


@dataclass
class Solves:
    """The blind solves VERIFY adds: one call per generation call, of its questions. Under
    `replace` each disputed question is generated and solved again: not counted here (the
    share of disputed keys is the model's own)."""

    mode: str
    model: str
    price: Price
    calls: int = 0
    prompt_tokens: int = 0
    max_completion_tokens: int = 0
    questions: int = 0
    owed: int = 0  # of `questions`, those already stored whose solve is owed

    @property
    def expected_completion_tokens(self) -> int:
        return self.calls * verify.SOLVE_TOKENS_OVERHEAD // 4 + self.questions * EXPECTED_ANSWER_TOKENS

    @property
    def worst_usd(self) -> float:
        prompt = reserve_prompt_tokens(self.prompt_tokens, self.model)
        return self.price.cost_usd(prompt, self.max_completion_tokens)

    @property
    def expected_usd(self) -> float:
        return self.price.cost_usd(self.prompt_tokens, self.expected_completion_tokens)

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "model": self.model, "calls": self.calls,
                "questions": self.questions, "owed": self.owed, "prompt_tokens": self.prompt_tokens,
                "max_completion_tokens": self.max_completion_tokens,
                "expected_completion_tokens": self.expected_completion_tokens,
                "price": {"prompt_per_mtok": self.price.prompt_per_mtok,
                          "completion_per_mtok": self.price.completion_per_mtok,
                          "source": self.price.source, "known": self.price.known},
                "worst_usd": round(self.worst_usd, 6),
                "expected_usd": round(self.expected_usd, 6)}


@dataclass
class Estimate:
    exam: str
    model: str
    tokenizer: str
    price: Price
    completion_per_question: float
    completion_source: str
    chapters: list[ChapterEstimate] = field(default_factory=list)
    worst_price: Price | None = None  # the dearer endpoint, when a fallback may serve calls
    # The models that may serve calls: a prompt not counted exactly by all of them is reserved
    # with the margin, as a call's own reservation is (examforge.tokens.reserve_prompt_tokens).
    models: tuple[str, ...] = ()
    # VERIFY: one blind solve per generation call, of its questions (runner.verify).
    verify: Solves | None = None
    # Per item type, when a chapter asks for types other than mcq (examforge.item_types).
    types: dict[str, TypeEstimate] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.chapters)

    @property
    def questions(self) -> int:
        return sum(max(0, c.target - c.stored) for c in self.chapters)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.chapters)

    @property
    def max_completion_tokens(self) -> int:
        return sum(c.max_completion_tokens for c in self.chapters)

    @property
    def expected_completion_tokens(self) -> int:
        if self.types:  # each type at its own tokens per question
            return round(sum(t.expected_completion_tokens for t in self.types.values()))
        return round(self.questions * self.completion_per_question)

    @property
    def worst_usd(self) -> float:
        """Generation and blind solves (VERIFY), at worst case."""
        prompt = reserve_prompt_tokens(self.prompt_tokens, *(self.models or (self.model,)))
        return ((self.worst_price or self.price).cost_usd(prompt, self.max_completion_tokens)
                + (self.verify.worst_usd if self.verify else 0.0))

    @property
    def expected_usd(self) -> float:
        return (self.price.cost_usd(self.prompt_tokens, self.expected_completion_tokens)
                + (self.verify.expected_usd if self.verify else 0.0))

    def as_dict(self) -> dict[str, object]:
        return {"exam": self.exam, "model": self.model, "tokenizer": self.tokenizer,
                "calls": self.calls, "questions": self.questions,
                "prompt_tokens": self.prompt_tokens,
                "max_completion_tokens": self.max_completion_tokens,
                "expected_completion_tokens": self.expected_completion_tokens,
                "completion_per_question": round(self.completion_per_question, 1),
                "completion_source": self.completion_source,
                "price": {"prompt_per_mtok": self.price.prompt_per_mtok,
                          "completion_per_mtok": self.price.completion_per_mtok,
                          "cached_prompt_per_mtok": self.price.cached_per_mtok,
                          "source": self.price.source, "known": self.price.known},
                "worst_usd": round(self.worst_usd, 6),
                "expected_usd": round(self.expected_usd, 6),
                "verify": self.verify.as_dict() if self.verify else None,
                "types": [t.as_dict(self.price, self.worst_price or self.price)
                          for t in self.types.values()] or None,
                "chapters": [c.__dict__ for c in self.chapters]}


def estimate(slug: str, syllabus: Syllabus, settings: Settings, *,
             stored: dict[str, list[str]] | None = None,
             completion_per_question: float | None = None, batch: bool = False,
             material: Mapping[str, Sequence[Passage]] | None = None,
             verify: str | None = None, owed: Mapping[str, int] | None = None) -> Estimate:
    """`stored`: the questions already stored per chapter (nothing is asked for those);
    `completion_per_question`: what this database's calls have used so far, if any; `batch`:
    the exam goes through the provider's Batch API (priced at LLM_BATCH_DISCOUNT, primary
    endpoint only, as runner.batching books and reserves it); `material`: each chapter's
    passages (examforge.sources), whose slice's share each prompt carries, as the pipeline's.
    `verify`: the exam's blind-solve policy (default VERIFY); `owed`: per chapter, the stored
    questions whose blind solve is still owed under it (pending verdicts, and the questions
    stored unverified that a raised policy makes pending), priced as the solve calls that
    runner.verify sends for them (up to SOLVE_MAX_QUESTIONS a call)."""
    verify = settings.verify if verify is None else verify
    stored = stored or {}
    placeholder = _placeholder([q for texts in stored.values() for q in texts])
    model = settings.llm_model
    # At the tier calls are sent at (LLM_SERVICE_TIER: flex costs half); the fallback is sent
    # no tier.
    if batch:
        price = settings.price().scaled(settings.llm_batch_discount, "batch")
    else:
        price = settings.price_at(settings.service_tier)
    worst = price
    if settings.llm_fallback_base_url and not batch:
        fallback = settings.price(fallback=True)
        if fallback.completion_per_mtok + fallback.prompt_per_mtok > \
                price.completion_per_mtok + price.prompt_per_mtok:
            worst = fallback
    est = Estimate(
        exam=slug, model=model, tokenizer=encoding_name(model), price=price,
        completion_per_question=completion_per_question or DEFAULT_COMPLETION_PER_QUESTION,
        completion_source=("observed in this database" if completion_per_question
                           else "default"),
        worst_price=worst,
        models=(model,) + ((settings.llm_fallback_model or model,)
                           if settings.llm_fallback_base_url else ()))
    solver = None
    if verify != "off" and not batch:  # batch mode sends no blind solve
        vs = settings.verify_settings()
        est.verify = Solves(verify, vs.llm_model, vs.price_at(vs.service_tier))
        solver = est.verify
        for chapter_id, n in sorted((owed or {}).items()):
            while n > 0:  # the solves owed for questions already stored
                want = min(n, verify_mod.SOLVE_MAX_QUESTIONS)
                solver.calls += 1
                solver.questions += want
                solver.owed += want
                language = next((c.language for c in syllabus.chapters if c.id == chapter_id),
                                None) or syllabus.language
                solver.prompt_tokens += count_messages(verify_mod.build_messages(
                    [verify_mod.item(placeholder, _CHOICES)] * want, [], language), solver.model)
                solver.max_completion_tokens += verify_mod.max_tokens(want)
                n -= want
    from examforge.prompt import levels_for

    typed = any(ch.item_types is not None for ch in syllabus.chapters)
    weights = type_weights(model) if typed else {}
    for chapter in syllabus.chapters:
        texts = list(stored.get(chapter.id, []))
        ch = ChapterEstimate(chapter.id, stored=len(texts), target=chapter.questions)
        ranges = list(slice_ranges(1, chapter.questions, settings.slice_questions))
        for first, count in ranges:
            # As the pipeline: each slice in batches of its own; the prompt lists what the
            # chapter has (the stored questions are taken to be its first numbers).
            have = max(0, min(count, len(texts) - (first - 1)))
            avoid = (texts + [placeholder] * (first - 1 + have - len(texts)))[-20:]
            numbers = ((first, first + count - 1, chapter.questions) if len(ranges) > 1
                       else None)
            passages = (material or {}).get(chapter.id) or ()
            block = slice_material(
                passages, first, count, chapter.questions, settings.source_prompt_tokens,
                lambda text: count_text(text, model)).block if passages else None
            # The solver is shown the passages its questions cite: the slice's share, taken
            # in turn.
            share = [passages[i].text for i in slice_passages(
                len(passages), first, count, chapter.questions)] if passages else []
            stored_types: Counter[str] = Counter()  # the stored are taken to be mcq
            while have < count:
                want = min(settings.questions_per_call, count - have)
                counted = (ch.prompt_tokens, ch.max_completion_tokens)  # before this call
                levels = levels_for(chapter, want)
                if chapter.item_types is not None:
                    asked, trues = ask_types(chapter.item_types, first, count,
                                             stored_types, want)
                    levels = dataclasses.replace(levels, types=asked, true_count=trues)
                    stored_types.update(asked)
                messages = build_messages(slug, syllabus.title, chapter, want, avoid,
                                          numbers=numbers, material=block, levels=levels)
                ch.calls += 1
                ch.prompt_tokens += count_messages(messages, model)
                ch.max_completion_tokens += settings.max_tokens(
                    want, fixed_allowance(settings, chapter.language or syllabus.language))
                if solver is not None:  # the batch's blind solve (runner.verify)
                    solver.calls += 1
                    solver.questions += want
                    # Grouped as runner.verify sends them: each passage shown once a call.
                    cited = sorted(share[(have + i) % len(share)] for i in range(want)) \
                        if share else []
                    # Each type as the solver is shown it (a multi's five choices, the
                    # others' none) and as its answer is capped (examforge.verify).
                    shown = [verify_mod.item(placeholder, _TYPE_CHOICES.get(kind, ()), kind)
                             for kind, n in (levels.types or {"mcq": want}).items()
                             for _ in range(n)]
                    solver.prompt_tokens += count_messages(
                        verify_mod.build_messages(shown, cited,
                                                  chapter.language or syllabus.language),
                        solver.model)
                    solver.max_completion_tokens += verify_mod.max_tokens(want, shown)
                if typed:  # this call's prompt and cap, shared out by the counts it asks for
                    call_prompt, call_cap = (ch.prompt_tokens - counted[0],
                                             ch.max_completion_tokens - counted[1])
                    for kind, n in (levels.types or {"mcq": want}).items():
                        t = est.types.setdefault(kind, TypeEstimate(kind))
                        t.questions += n
                        t.prompt_tokens += call_prompt * n / want
                        t.max_completion_tokens += call_cap * n / want
                        t.expected_completion_tokens += (
                            est.completion_per_question * weights[kind] * n)
                have += want
                avoid = (avoid + [placeholder] * want)[-20:]
        est.chapters.append(ch)
    return est


@dataclass(frozen=True)
class ReplaceWorstCase:
    """What one slice can spend under VERIFY=replace before it stops, when the solver
    disputes every key (`replace_worst_case`)."""

    rounds: int  # generation calls, each followed by one blind solve of its questions
    questions: int  # generated, solved and withdrawn
    generation_usd: float  # each generation call at its worst case
    solve_usd: float  # each solve at its worst case

    @property
    def calls(self) -> int:
        return 2 * self.rounds

    @property
    def usd(self) -> float:
        return self.generation_usd + self.solve_usd


def replace_worst_case(settings: Settings, target: int, generation_prompt_tokens: int,
                       solve_prompt_tokens: int, language: str | None = None) -> ReplaceWorstCase:
    """The worst case of one slice of `target` questions under VERIFY=replace whose solver
    disputes every key (runner.verify.check_disputes): each round asks for
    q = min(QUESTIONS_PER_CALL, target) questions (every number is free again: each key was
    disputed and withdrawn) and solves them in one call, so the disputes in a row reach
    VERIFY_MAX_DISPUTED_IN_ROW after ceil(K / q) rounds, and the exam pauses: 2 * ceil(K / q)
    paid calls. In dollars, each call at its worst case, what the budget reserves for it:
    its prompt (the largest of its kind, `*_prompt_tokens`, with the reservation margin) and
    all of its max_tokens, at the generation and the solver's prices. Re-asks after invalid
    output (up to MAX_REASKS in a row) would add generation calls; a reply always usable is
    assumed here.

    Under a budget no call is sent whose worst case does not fit, and a call that does not
    fit asks for fewer questions, down to one: the slice then spends at most the budget, in
    at most 2 * VERIFY_MAX_DISPUTED_IN_ROW calls (rounds of one question each).

    `language`: the chapter's (None: English); a generation call's max_tokens is its fixed
    allowance per question (examforge.sizing.fixed_allowance: a Persian reply's is 3.5 times
    English's)."""
    from examforge.sizing import fixed_allowance

    q = max(1, min(settings.questions_per_call, target, verify.SOLVE_MAX_QUESTIONS))
    rounds = -(-settings.verify_max_disputed_in_row // q)
    price = settings.price_at(settings.service_tier)
    generation = price.cost_usd(
        reserve_prompt_tokens(generation_prompt_tokens, settings.llm_model),
        settings.max_tokens(q, fixed_allowance(settings, language)))
    vs = settings.verify_settings()
    solve = vs.price_at(vs.service_tier).cost_usd(
        reserve_prompt_tokens(solve_prompt_tokens, vs.llm_model), verify.max_tokens(q))
    return ReplaceWorstCase(rounds, rounds * q, rounds * generation, rounds * solve)
