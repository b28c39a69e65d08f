"""Question texts: lexically distinct questions per chapter, and paraphrases of them.

A question is a tuple of slots (stem, concept, scenario, actor, goal, qualifier) drawn from
word banks. Serial ``s`` of a chapter maps, through a per-chapter affine bijection, to a row
``n`` of an orthogonal array over ``Z_P`` (``P`` prime): row ``n = a*P + b`` takes the slots
``a, b, a+b, a+2b, a+3b (mod P)``. Two rows of such an array agree in at most one of those
columns, so two questions of one chapter share at most one of their five word groups: their
word-shingle Jaccard stays far below 0.3 (the test measures it). Each chapter draws its own
subset and order of every bank, so chapters read differently too. ``P*P`` (841) questions per
chapter are pairwise distinct this way; beyond that a chapter cycles through the array again
with its banks re-drawn, and a "(part N)" suffix keeps the texts unique.

A paraphrase (``reword``) renders the same slots with other surface forms, the way a model
repeats itself over a long chapter: "Which of the following ..." against "What ...", synonyms
for the concept, actor and goal, the scenario clause moved to the front or the end, another
qualifier, numbers written another way. The choices and the answer stay the same.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mockllm.prompt import ChatPrompt
    from mockllm.replies import Item

P = 29  # prime; every bank below has at least P entries
ANSWER_SLOTS = 4

# (the "Which ..." form, the "What ..." form). {q} is a qualifier, where the stem has one.
STEMS: tuple[tuple[str, str], ...] = (
    ("Which of the following is the {q} way for {actor} to handle {concept} in {title} {goal}",
     "What is the {q} way for {actor} to handle {concept} in {title} {goal}"),
    ("Which step should {actor} take first to improve {concept} for {title} {goal}",
     "What should {actor} do first to improve {concept} for {title} {goal}"),
    ("Which choice describes the {q} plan {actor} could adopt for {concept} in {title} {goal}",
     "What is the {q} plan {actor} could adopt for {concept} in {title} {goal}"),
    ("Which measure would let {actor} secure {concept} within {title} {goal}",
     "What measure would let {actor} secure {concept} within {title} {goal}"),
    ("Which of these actions is the {q} option for {actor} reviewing {concept} in {title} {goal}",
     "What action is the {q} option for {actor} reviewing {concept} in {title} {goal}"),
    ("Which decision about {concept} in {title} should {actor} make {goal}",
     "What decision about {concept} in {title} should {actor} make {goal}"),
    ("Which habit helps {actor} keep {concept} healthy across {title} {goal}",
     "What habit helps {actor} keep {concept} healthy across {title} {goal}"),
    ("Which of the following should {actor} prioritise for {concept} in {title} {goal}",
     "What should {actor} prioritise for {concept} in {title} {goal}"),
    ("Which tool or technique gives {actor} the {q} view of {concept} in {title} {goal}",
     "What tool or technique gives {actor} the {q} view of {concept} in {title} {goal}"),
    ("Which way of documenting {concept} in {title} suits {actor} {goal}",
     "What way of documenting {concept} in {title} suits {actor} {goal}"),
    ("Which of the listed tasks would {actor} automate first around {concept} in {title} {goal}",
     "What would {actor} automate first around {concept} in {title} {goal}"),
    ("Which responsibility for {concept} in {title} should {actor} delegate {goal}",
     "What responsibility for {concept} in {title} should {actor} hand over {goal}"),
    ("Which signal should {actor} watch for {concept} in {title} {goal}",
     "What signal should {actor} keep an eye on for {concept} in {title} {goal}"),
    ("Which standard is the {q} fit when {actor} formalises {concept} in {title} {goal}",
     "What standard is the {q} fit when {actor} formalises {concept} in {title} {goal}"),
    ("Which budget line should {actor} reserve for {concept} in {title} {goal}",
     "What budget line should {actor} set aside for {concept} in {title} {goal}"),
    ("Which message should {actor} send stakeholders about {concept} in {title} {goal}",
     "What should {actor} tell stakeholders about {concept} in {title} {goal}"),
    ("Which criterion lets {actor} evaluate {concept} in {title} {goal}",
     "What criterion lets {actor} judge {concept} in {title} {goal}"),
    ("Which simplification of {concept} in {title} is the {q} move for {actor} {goal}",
     "What simplification of {concept} in {title} is the {q} move for {actor} {goal}"),
    ("Which safeguard should {actor} add to {concept} in {title} {goal}",
     "What safeguard should {actor} build into {concept} in {title} {goal}"),
    ("Which schedule for revisiting {concept} in {title} should {actor} follow {goal}",
     "What schedule for revisiting {concept} in {title} should {actor} keep {goal}"),
    ("Which validation step confirms that {actor} has {concept} in {title} under control {goal}",
     "What validation step shows that {actor} has {concept} in {title} under control {goal}"),
    ("Which of the following trade-offs around {concept} in {title} is the {q} one for {actor} {goal}",
     "What trade-off around {concept} in {title} is the {q} one for {actor} {goal}"),
    ("Which question should {actor} ask first about {concept} in {title} {goal}",
     "What should {actor} ask first about {concept} in {title} {goal}"),
    ("Which pilot would tell {actor} most about {concept} in {title} {goal}",
     "What pilot would tell {actor} the most about {concept} in {title} {goal}"),
    ("Which of these metrics is the {q} guide for {actor} tracking {concept} in {title} {goal}",
     "What metric is the {q} guide for {actor} tracking {concept} in {title} {goal}"),
    ("Which handover note about {concept} in {title} should {actor} write {goal}",
     "What handover note about {concept} in {title} should {actor} leave {goal}"),
    ("Which default setting for {concept} in {title} should {actor} choose {goal}",
     "What default setting for {concept} in {title} should {actor} pick {goal}"),
    ("Which of the options is the {q} escalation path for {actor} dealing with {concept} in {title} {goal}",
     "What is the {q} escalation path for {actor} dealing with {concept} in {title} {goal}"),
    ("Which experiment should {actor} run on {concept} in {title} {goal}",
     "What experiment should {actor} carry out on {concept} in {title} {goal}"),
)

# (wording, synonym)
CONCEPTS: tuple[tuple[str, str], ...] = (
    ("capacity planning", "capacity forecasting"),
    ("access control", "permission management"),
    ("failure isolation", "fault containment"),
    ("cost allocation", "spend attribution"),
    ("data retention", "record keeping rules"),
    ("version pinning", "dependency locking"),
    ("audit logging", "activity trails"),
    ("latency budgets", "response time allowances"),
    ("schema changes", "data model revisions"),
    ("backup rotation", "snapshot cycling"),
    ("rollout staging", "phased releases"),
    ("quota management", "usage ceilings"),
    ("secret rotation", "credential renewal"),
    ("cache invalidation", "cache refresh rules"),
    ("load shedding", "overload protection"),
    ("replica placement", "copy distribution"),
    ("alert thresholds", "alarm trigger levels"),
    ("change approval", "change sign-off"),
    ("incident reviews", "post-incident analysis"),
    ("encryption at rest", "stored data encryption"),
    ("network segmentation", "network partitioning"),
    ("throughput tuning", "throughput optimisation"),
    ("retry policies", "retry rules"),
    ("configuration drift", "settings divergence"),
    ("service ownership", "service accountability"),
    ("health checks", "liveness probes"),
    ("documentation upkeep", "keeping documentation current"),
    ("tagging conventions", "labelling schemes"),
    ("dependency mapping", "charting dependencies"),
    ("traffic routing", "request steering"),
    ("key management", "handling of encryption keys"),
)

SCENARIOS: tuple[tuple[str, str], ...] = (
    ("during a quarterly compliance audit", "while a quarterly compliance review is under way"),
    ("after traffic spikes to 12,000 requests per second", "following a sudden surge to 12,000 requests per second"),
    ("when a legacy workload is being migrated", "while an older workload moves to the new setup"),
    ("before a major product launch", "ahead of a big release"),
    ("while a new region is being brought online", "as a fresh region comes into service"),
    ("after a failed deployment was rolled back", "once a broken release has been reverted"),
    ("when the monthly bill grows faster than usage", "as monthly costs outpace actual usage"),
    ("during a 4-hour overnight maintenance window", "in a scheduled 4-hour late-night maintenance slot"),
    ("when two teams share the same environment", "if a single environment serves two teams"),
    ("after a security review flagged a gap", "once an internal security check has found a weakness"),
    ("while onboarding 3 new engineers", "as a group of 3 new engineers joins"),
    ("when a key vendor announces a deprecation", "after an important supplier retires a feature"),
    ("during a disaster recovery drill", "while rehearsing recovery from a major outage"),
    ("when latency targets are missed for 7 days", "after 7 days of missed response time goals"),
    ("before handing the system to an operations team", "ahead of a handover to the operations group"),
    ("when a customer reports inconsistent results", "after a client complains about results that do not match"),
    ("while budgets are frozen for the quarter", "during a quarter with no new spending allowed"),
    ("after an auditor asks for evidence of controls", "once an external assessor requests proof of safeguards"),
    ("when traffic shifts to mobile clients", "as most requests start arriving from phones"),
    ("during a merger of two product lines", "while two product lines are being combined"),
    ("when the on-call rotation is short-staffed", "if too few people are available for on-call duty"),
    ("after data volumes reach 1,500 GB in 30 days", "once the stored data has grown to 1,500 GB within 30 days"),
    ("before a contract renewal with a hosting provider", "ahead of renegotiating the hosting agreement"),
    ("when a pilot project becomes production", "as a trial project turns into a live service"),
    ("after a near miss that nobody noticed for days", "following a close call that went unseen for days"),
    ("while a regulator is drafting new rules", "as new regulations are being written"),
    ("when the original author has left the company", "now that the person who built it has moved on"),
    ("during the busiest week of the year, with 250ms p99 latency", "in the peak week of the annual cycle, with 250ms p99 latency"),
    ("after a dependency released a breaking change", "once an upstream library shipped an incompatible update"),
    ("when 50% of the fleet runs an older version", "while 50% of the servers still run an outdated release"),
)

ACTORS: tuple[tuple[str, str], ...] = (
    ("an operator", "a system operator"),
    ("a platform engineer", "an infrastructure engineer"),
    ("the on-call developer", "the developer on call"),
    ("a security reviewer", "a security auditor"),
    ("a project lead", "a team lead"),
    ("a new administrator", "a recently hired administrator"),
    ("a cost analyst", "a finance analyst"),
    ("the release manager", "the person managing releases"),
    ("a database specialist", "a data store expert"),
    ("a support engineer", "a customer support engineer"),
    ("a solutions architect", "a system designer"),
    ("the compliance officer", "the person responsible for compliance"),
    ("a site reliability engineer", "an SRE"),
    ("a junior developer", "an entry-level developer"),
    ("the product owner", "the owner of the product"),
    ("a consultant", "an outside adviser"),
    ("a quality engineer", "a test engineer"),
    ("the network team", "the networking group"),
    ("a data engineer", "a pipeline engineer"),
    ("an internal auditor", "an in-house inspector"),
    ("a startup founder", "the founder of a small company"),
    ("an IT manager", "a technology manager"),
    ("a candidate studying for the exam", "a student preparing for the test"),
    ("a cloud architect", "a cloud designer"),
    ("the operations lead", "the head of operations"),
    ("a backend developer", "a server-side developer"),
    ("a technical writer", "a documentation author"),
    ("the incident commander", "the person leading the incident response"),
    ("a procurement officer", "a purchasing manager"),
    ("a machine learning engineer", "an ML engineer"),
)

GOALS: tuple[tuple[str, str], ...] = (
    ("to keep costs predictable", "so that spending stays predictable"),
    ("to reduce the risk of data loss", "so that less data can be lost"),
    ("to meet the service level objective", "so the agreed service target is met"),
    ("to pass the next audit", "so the coming audit succeeds"),
    ("to shorten recovery time", "so that recovery takes less time"),
    ("to avoid surprises in production", "so nothing unexpected happens in production"),
    ("to limit the impact of mistakes", "so that errors do less damage"),
    ("to support twice the current load", "so the system copes with double today's load"),
    ("to keep customers informed", "so customers stay in the loop"),
    ("to make ownership clear", "so that everyone knows who owns what"),
    ("to stay within the approved budget", "so the approved budget is not exceeded"),
    ("to detect problems earlier", "so issues are noticed sooner"),
    ("to simplify future upgrades", "so later upgrades are easier"),
    ("to protect sensitive records", "so confidential records stay safe"),
    ("to keep latency low for users", "so users see fast responses"),
    ("to reduce manual work", "so less work is done by hand"),
    ("to satisfy the security team", "so the security team signs off"),
    ("to make results reproducible", "so the same results can be obtained again"),
    ("to prepare for a regional outage", "so a regional failure can be survived"),
    ("to keep environments consistent", "so all environments stay alike"),
    ("to lower operational toil", "so routine operational chores shrink"),
    ("to give auditors clear evidence", "so auditors get unambiguous proof"),
    ("to speed up onboarding", "so new staff become productive faster"),
    ("to cut wasted compute", "so idle machines stop burning money"),
    ("to keep the rollback path open", "so a release can still be undone"),
    ("to avoid a single point of failure", "so no one component can take everything down"),
    ("to shrink the blast radius of outages", "so an outage touches fewer users"),
    ("to keep licences compliant", "so licence terms are respected"),
    ("to make capacity visible to finance", "so the finance team sees what capacity costs"),
)

QUALIFIERS: tuple[tuple[str, str], ...] = (
    ("best", "most effective"),
    ("safest", "least risky"),
    ("most reliable", "most dependable"),
    ("most practical", "most workable"),
    ("most appropriate", "most suitable"),
    ("most cost-effective", "most economical"),
    ("simplest", "least complicated"),
    ("most defensible", "most justifiable"),
    ("quickest", "fastest"),
    ("most sustainable", "most durable"),
    ("clearest", "most transparent"),
)

GOOD_PRACTICES: tuple[str, ...] = (
    "Define a clear owner and review the setup on a fixed schedule",
    "Automate the check and alert when it deviates from the baseline",
    "Start with a small pilot and measure the effect before expanding",
    "Record the decision together with the reason behind it",
    "Roll the change out in stages with a tested rollback plan",
    "Measure the current baseline before changing anything",
    "Limit access to the people who need it and log every use",
    "Rehearse the recovery path regularly and time it",
    "Tie every resource to a budget owner through tags",
    "Keep the configuration in version control and review every change",
    "Set explicit thresholds and page only on user-visible symptoms",
    "Separate environments so a mistake in one cannot reach another",
)

BAD_PRACTICES: tuple[str, ...] = (
    "Wait until users complain before doing anything",
    "Apply the change everywhere at once without testing",
    "Rely on one senior engineer remembering how it works",
    "Disable the related alerts to reduce noise",
    "Skip the documentation to save time",
    "Grant everyone administrator rights to avoid delays",
    "Postpone the decision until the next budget cycle",
    "Copy the settings from an unrelated project",
    "Buy the largest available option just in case",
    "Let each developer choose their own approach",
    "Keep the credentials in a shared spreadsheet",
    "Treat every warning as a false positive",
    "Turn off logging in production to improve speed",
    "Ask the vendor to take full responsibility for it",
)

for _bank in (STEMS, CONCEPTS, SCENARIOS, ACTORS, GOALS):
    assert len(_bank) >= P, "every bank needs at least P entries for the orthogonal array"


@dataclass(frozen=True)
class Slots:
    """The meaning of a question: which word group fills each part (indices into the banks)."""

    stem: int
    concept: int
    scenario: int
    actor: int
    goal: int
    qualifier: int
    part: int  # 0 for the first P*P questions of a chapter, then 1, 2, ...


@dataclass(frozen=True)
class Style:
    """How a question is worded; a paraphrase flips some of these."""

    what_form: bool = False  # "What ..." instead of "Which ..."
    scenario_first: bool = False
    concept_alt: bool = False  # the concept's synonym
    actor_alt: bool = False
    goal_alt: bool = False
    scenario_alt: bool = False
    qualifier_alt: bool = False
    numbers_alt: bool = False  # numbers written another way


@dataclass(frozen=True)
class _ChapterBanks:
    multiplier: int
    offset: int
    stems: tuple[int, ...]
    concepts: tuple[int, ...]
    scenarios: tuple[int, ...]
    actors: tuple[int, ...]
    goals: tuple[int, ...]


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _chapter_banks(chapter_key: str, part: int) -> _ChapterBanks:
    rng = _rng("banks", chapter_key, part)
    # An affine map s -> (m*s + c) mod P*P is a bijection when P does not divide m; a
    # multiplier with both digits nonzero makes consecutive serials change every column.
    multiplier = rng.randrange(1, P) * P + rng.randrange(1, P)
    return _ChapterBanks(
        multiplier=multiplier,
        offset=rng.randrange(P * P),
        stems=tuple(rng.sample(range(len(STEMS)), P)),
        concepts=tuple(rng.sample(range(len(CONCEPTS)), P)),
        scenarios=tuple(rng.sample(range(len(SCENARIOS)), P)),
        actors=tuple(rng.sample(range(len(ACTORS)), P)),
        goals=tuple(rng.sample(range(len(GOALS)), P)),
    )


_BANKS_CACHE: dict[tuple[str, int], _ChapterBanks] = {}


def slots_for(chapter_key: str, serial: int) -> Slots:
    """The slots of question ``serial`` (1, 2, ...) of a chapter: a pure function."""
    index = max(serial, 1) - 1
    part, index = divmod(index, P * P)
    banks = _BANKS_CACHE.get((chapter_key, part))
    if banks is None:
        banks = _BANKS_CACHE.setdefault((chapter_key, part), _chapter_banks(chapter_key, part))
    row = (banks.multiplier * index + banks.offset) % (P * P)
    a, b = divmod(row, P)
    return Slots(
        stem=banks.stems[a],
        concept=banks.concepts[b],
        scenario=banks.scenarios[(a + b) % P],
        actor=banks.actors[(a + 2 * b) % P],
        goal=banks.goals[(a + 3 * b) % P],
        qualifier=(a + 4 * b) % P % len(QUALIFIERS),
        part=part,
    )


def base_style(serial: int) -> Style:
    """The wording of a question when first served, varied with the serial: two questions that
    share a goal or a scenario often word it differently, which keeps their overlap low."""
    return Style(
        what_form=serial % 3 == 0,
        scenario_first=serial % 4 == 1,
        goal_alt=serial * 7 % 5 < 2,
        scenario_alt=serial * 3 % 7 < 3,
    )


def render(slots: Slots, style: Style, title: str) -> str:
    """The question text for ``slots`` worded as ``style``."""
    which_form, what_form = STEMS[slots.stem]
    template = what_form if style.what_form else which_form
    concept = CONCEPTS[slots.concept][1 if style.concept_alt else 0]
    actor = ACTORS[slots.actor][1 if style.actor_alt else 0]
    goal = GOALS[slots.goal][1 if style.goal_alt else 0]
    qualifier = QUALIFIERS[slots.qualifier][1 if style.qualifier_alt else 0]
    scenario = SCENARIOS[slots.scenario][1 if style.scenario_alt else 0]
    body = template.format(q=qualifier, actor=actor, concept=concept, title=title, goal=goal)
    if style.scenario_first:
        text = f"{scenario[0].upper()}{scenario[1:]}, {body[0].lower()}{body[1:]}?"
    else:
        text = f"{body} {scenario}?"
    if style.numbers_alt:
        text = respell_numbers(text)
    if slots.part:
        text = f"{text} (part {slots.part + 1})"
    return text


def has_qualifier(slots: Slots) -> bool:
    return "{q}" in STEMS[slots.stem][0]


# The transformations a paraphrase draws from, the ways a model rewords its own question when
# it writes it again: "Which of the following ..." against "What ...", the scenario clause
# moved, a synonym for the concept or the actor, another qualifier, the goal or the scenario
# said in other words, numbers written another way ("12,000" / "12000", "7" / "seven",
# "50%" / "50 percent", "250ms" / "250 ms"). A paraphrase takes one to three of them, drawn
# per (chapter, serial, variant); of the four that replace words of the subject (concept,
# actor, goal, scenario) one, or the two short ones (concept and actor), and a long phrase
# (goal or scenario) said anew with one other change at most: a model that writes its
# question again keeps most of its words, and the paraphrase stays nearer its original than
# any other question of the chapter (the test checks it). Rephrasings that keep little of the
# wording are semantic, not near, duplicates: see examforge.neardup.
CHANGES: tuple[str, ...] = ("form", "position", "concept", "actor", "qualifier", "goal",
                            "scenario", "numbers")
_SUBJECT_CHANGES = frozenset({"concept", "actor", "goal", "scenario"})
_CHANGE_COUNTS = (1, 2, 2, 2, 3)  # drawn uniformly: mostly two changes


def reword_changes(chapter_key: str, serial: int, variant: int, slots: Slots,
                   original: Style) -> tuple[str, ...]:
    """The changes paraphrase ``variant`` of question ``serial`` makes (a pure function)."""
    rng = _rng("reword", chapter_key, serial, variant)
    usable = [c for c in CHANGES
              if (c != "qualifier" or has_qualifier(slots))
              and (c != "numbers" or has_numbers(slots))]
    for _ in range(100):
        count = rng.choice(_CHANGE_COUNTS)
        changes = tuple(rng.sample(usable, count))
        subject = _SUBJECT_CHANGES.intersection(changes)
        long_phrase = bool(subject & {"goal", "scenario"})
        if (len(subject) <= 1 or subject == {"concept", "actor"}) and not (long_phrase and count > 2):
            return changes
    return ("form", "position")


def reword_style(slots: Slots, original: Style, changes: tuple[str, ...]) -> Style:
    """Another wording of the same question, with ``changes`` applied."""
    style = original
    for change in changes:
        if change == "form":
            style = replace(style, what_form=not style.what_form)
        elif change == "position":
            style = replace(style, scenario_first=not style.scenario_first)
        elif change == "concept":
            style = replace(style, concept_alt=not style.concept_alt)
        elif change == "actor":
            style = replace(style, actor_alt=not style.actor_alt)
        elif change == "goal":
            style = replace(style, goal_alt=not style.goal_alt)
        elif change == "scenario":
            style = replace(style, scenario_alt=not style.scenario_alt)
        elif change == "qualifier":
            style = replace(style, qualifier_alt=not style.qualifier_alt)
        elif change == "numbers":
            style = replace(style, numbers_alt=not style.numbers_alt)
    return style


_SMALL = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
          "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen", "twenty")
_TENS = {30: "thirty", 40: "forty", 50: "fifty"}


def respell_numbers(text: str) -> str:
    """The same numbers written another way, as a model varies them between two answers."""
    def one(match: re.Match[str]) -> str:
        number, unit = match.group(1), match.group(2) or ""
        if "," in number:
            return number.replace(",", "") + unit  # 12,000 requests -> 12000 requests
        value = int(number)
        if unit.strip() == "%":
            return f"{number} percent"
        if unit and not unit.startswith((" ", "-")):
            return f"{number} {unit}"  # 250ms -> 250 ms
        word = _SMALL[value] if value < len(_SMALL) else _TENS.get(value)
        return f"{word}{unit}" if word else match.group(0)

    return re.sub(r"\b(\d[\d,]*)(%| ?%|[a-zA-Z]+\b|-| )?", one, text)


def has_numbers(slots: Slots) -> bool:
    return any(ch.isdigit() for ch in SCENARIOS[slots.scenario][0])


def answer_index(serial: int, answer_position: int | None) -> int:
    """Where the correct choice goes: fixed when configured, else spread over the four slots."""
    return answer_position if answer_position is not None else serial % ANSWER_SLOTS


def make_question(
    chapter_key: str, title: str, serial: int, answer_position: int | None = None
) -> dict[str, Any]:
    """Question ``serial`` of a chapter, well formed: four distinct choices, one correct."""
    slots = slots_for(chapter_key, serial)
    return question_from(slots, base_style(serial), chapter_key, title, serial, answer_position)


def question_from(
    slots: Slots, style: Style, chapter_key: str, title: str, serial: int, answer_position: int | None
) -> dict[str, Any]:
    """The question of ``slots`` worded as ``style``; choices depend only on the serial."""
    rng = _rng("choices", chapter_key, serial)
    correct = rng.choice(GOOD_PRACTICES)
    choices = rng.sample(BAD_PRACTICES, ANSWER_SLOTS - 1)
    index = answer_index(serial, answer_position)
    choices.insert(index, correct)
    concept = CONCEPTS[slots.concept][0]
    return {
        "question": render(slots, style, title),
        "choices": choices,
        "answer_index": index,
        "explanation": f"{correct} keeps {concept} under control; the other options leave it to chance "
        "or add risk.",
    }


def reword(
    chapter_key: str, title: str, serial: int, variant: int, answer_position: int | None = None
) -> dict[str, Any]:
    """A paraphrase of question ``serial``: same meaning, choices and answer, other wording."""
    slots = slots_for(chapter_key, serial)
    original = base_style(serial)
    style = reword_style(slots, original, reword_changes(chapter_key, serial, variant, slots, original))
    return question_from(slots, style, chapter_key, title, serial, answer_position)


_GOOD = frozenset(GOOD_PRACTICES)


def true_index(choices: list[str] | tuple[str, ...]) -> int | None:
    """The correct choice of a question the mock wrote, from its choices alone (exactly one
    is a good practice, the others bad ones), whatever its answer_index says; None for
    choices the mock did not write."""
    found = [i for i, c in enumerate(choices) if c in _GOOD]
    return found[0] if len(found) == 1 else None


def with_wrong_key(question: dict[str, Any], chapter_key: str, serial: int, seed: int,
                   rate: float) -> dict[str, Any]:
    """``question`` with its answer_index moved to a wrong choice, for ``rate`` of the serials
    (the same serials for every reply and paraphrase of the chapter, for one seed)."""
    if rate <= 0 or _rng("wrong-key", seed, chapter_key, serial).random() >= rate:
        return question
    index = question["answer_index"]
    shift = 1 + _rng("wrong-key-to", seed, chapter_key, serial).randrange(ANSWER_SLOTS - 1)
    return {**question, "answer_index": (index + shift) % ANSWER_SLOTS}


def labelled(items: list[Item], prompt: ChatPrompt) -> list[Item]:
    """The reply's questions labelled as the prompt asks, the way a model that follows it
    does: the Difficulty line's levels in order (a reply shorter or longer than asked takes
    the first ones, or repeats the last), and a Bloom level cycled through the listed ones
    by serial. Nothing is added when the prompt asks for neither."""
    if not prompt.difficulties and not prompt.bloom:
        return items
    out = []
    for i, item in enumerate(items):
        question = dict(item.question)
        if prompt.difficulties:
            question["difficulty"] = prompt.difficulties[min(i, len(prompt.difficulties) - 1)]
        if prompt.bloom:
            question["bloom"] = prompt.bloom[item.serial % len(prompt.bloom)]
        out.append(replace(item, question=question))
    return out


def cited(items: list[Item], prompt: ChatPrompt) -> list[Item]:
    """The reply's questions citing the prompt's course-material passages, as a model asked
    to does: passage by serial, cycling through those offered, so that a slice's questions
    spread over its passages. Nothing is added when the prompt offers none."""
    if not prompt.passages:
        return items
    return [replace(item, question={**item.question,
                                    "source": prompt.passages[item.serial % len(prompt.passages)]})
            for item in items]


# The units a numerical item of the mock is asked in, by serial.
_UNITS = ("ms", "GB", "%", None)


def as_type(question: dict[str, Any], kind: str, serial: int, true: bool) -> dict[str, Any]:
    """The mock's four-choice question ``question`` (serial ``serial``) written as an item of
    ``kind`` (examforge.item_types), the way a model asked for that type writes one: the same
    stem, and an answer drawn from the same good and bad practices, so a blind solve that
    reads the good practices (mockllm.solve) can answer it. A wrong key (``with_wrong_key``
    moved the mcq's index) carries over: a multi's correct set then names a bad practice, a
    true/false statement's value is flipped, a short answer is a bad practice, a number is
    off by more than its tolerance."""
    if kind == "mcq":
        return {**question, "type": "mcq"}
    choices = list(question["choices"])
    right = true_index(choices)
    wrong_key = right is not None and right != question["answer_index"]
    good = choices[question["answer_index"]]
    stem = question["question"]
    base = {"type": kind, "explanation": question["explanation"]}
    for name in ("difficulty", "bloom", "source"):
        if name in question:
            base[name] = question[name]
    rng = _rng("typed", stem, serial)
    if kind == "multi":
        # 2 or 3 correct of 5 choices: the count varies with the serial.
        n_right = 2 + serial % 2
        extra = [g for g in GOOD_PRACTICES if g != choices[right or 0]]
        rights = [choices[right or 0], *rng.sample(extra, n_right - 1)]
        wrongs = rng.sample([b for b in BAD_PRACTICES if b not in choices], 5 - n_right)
        out = rights + wrongs
        rng.shuffle(out)
        correct = sorted(out.index(r) for r in rights)
        if wrong_key:  # one correct choice swapped for a wrong one
            correct = sorted([*correct[1:], out.index(wrongs[0])])
        return {**base, "question": f"{stem} (select all that apply)", "choices": out,
                "correct": correct}
    if kind == "truefalse":
        shown = choices[right or 0] if true else next(
            c for i, c in enumerate(choices) if i != (right or 0))
        return {**base, "question": f"True or false: for {stem[0].lower()}{stem[1:]}, "
                                    f"the answer is to {shown[0].lower()}{shown[1:]}.",
                "answer": true != wrong_key}
    if kind == "short":
        question_text = f"{stem} (answer in a few words)"
        key = short_truth(question_text)
        if wrong_key:  # another good practice: right in general, not for this question
            key = next(g for g in GOOD_PRACTICES[::-1] if g != key)
        accepted = [key]
        if rng.random() < 0.5:
            accepted.append(f"to {key[0].lower()}{key[1:]}")
        return {**base, "question": question_text, "accepted": accepted,
                "explanation": f"{key} is what the situation calls for."}
    # numeric: a value fixed by the serial, asked in a unit, with a tolerance of 5 % of it.
    value = numeric_truth(serial)
    unit = _UNITS[serial % len(_UNITS)]
    relative = serial % 2 == 0
    tolerance = 0.05 if relative else round(value * 0.05, 2)
    if wrong_key:
        value = round(value * 1.5, 2)
    return {**base, "question": f"{stem}: how many {unit or 'units'} does it take "
                                f"(item {serial})?", "value": value, "tolerance": tolerance,
            "relative": relative, "unit": unit}


def short_truth(question: str) -> str:
    """The answer a short-answer item of the mock is true to: a good practice drawn from its
    text, so that the mock's solver finds it again from the text alone."""
    return GOOD_PRACTICES[_rng("short-truth", question).randrange(len(GOOD_PRACTICES))]


def numeric_truth(serial: int) -> float:
    """The value a numerical item of the mock (serial `serial`, which its text shows) is true
    to."""
    return round(10 + (serial * 7919) % 990 + (serial % 4) * 0.25, 2)


_NUMERIC_SERIAL = re.compile(r"\(item (\d+)\)\?$")
_TRUEFALSE = re.compile(r"^True or false: .*, the answer is to (.*)\.$")
_GOOD_LOWER = {f"{g[0].lower()}{g[1:]}" for g in GOOD_PRACTICES}


def typed_truth(kind: str, question: str, choices: list[str]) -> Any:
    """The true answer of an item of the mock of type `kind` (not mcq), from what a solver
    is shown; None for an item the mock did not write."""
    if kind == "multi":
        found = frozenset(i for i, c in enumerate(choices) if c in _GOOD)
        return found if len(found) >= 2 else None
    if kind == "truefalse":
        m = _TRUEFALSE.match(question)
        return None if m is None else m.group(1) in _GOOD_LOWER
    if kind == "short":
        return short_truth(question) if question.endswith("(answer in a few words)") else None
    m = _NUMERIC_SERIAL.search(question)
    return None if m is None else numeric_truth(int(m.group(1)))


def typed(items: list[Item], prompt: ChatPrompt, seed: int = 0,
          wrong_key_rates: dict[str, float] | None = None) -> list[Item]:
    """The reply's questions of the types the prompt's Item types line asks for, in its
    order (a reply longer than the line repeats the last type), its first ``true_count``
    true/false statements true. A type with its own wrong-key rate (``wrong_key_rates``)
    has its keys drawn again at that rate. Nothing changes when the prompt has no such
    line."""
    if not prompt.types:
        return items
    out = []
    trues = 0
    for i, item in enumerate(items):
        kind = prompt.types[min(i, len(prompt.types) - 1)]
        true = kind == "truefalse" and trues < prompt.true_count
        trues += true
        question = item.question
        right = true_index(question["choices"])
        if wrong_key_rates and kind in wrong_key_rates and right is not None:
            question = with_wrong_key({**question, "answer_index": right}, prompt.key,
                                      item.serial, seed, wrong_key_rates[kind])
        out.append(replace(item, question=as_type(question, kind, item.serial, true)))
    return out
