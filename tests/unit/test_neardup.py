"""Near-duplicate detection: the labelled pairs that justify NEAR_DUP_THRESHOLD, the
comparison of the Jaccard of signatures (estimated by MinHash) with rapidfuzz, and the LSH
band keys that find candidates without comparing with every stored question."""

from __future__ import annotations

import itertools
import random
import statistics
import struct

import pytest
from rapidfuzz import fuzz

from examforge import neardup as nd
from mockllm import questions as mq

TITLE = "Cloud Concepts"
KEY = "ex/ch-1"

# Paraphrases written by hand, the kinds a model makes when it writes a question again:
# "Which of the following" lead-ins, synonyms, clauses moved, numbers written another way.
MUST_CATCH: list[tuple[str, str]] = [
    (("Which of the following AWS services provides durable object storage for static website "
     "assets?"),
     "Which AWS service offers durable object storage for static website assets?"),
    ("What is the default port used by HTTPS?",
     "By default, which port does HTTPS use?"),
    (("A company needs to keep its backups for 7 years to meet a regulation. Which storage "
     "class is the most cost-effective choice?"),
     ("To meet a regulation, a company must retain backups for seven years. What is the most "
     "cost-effective storage class?")),
    (("Which metric should an operator watch to detect that an application is running out of "
     "memory?"),
     ("To detect an application running out of memory, which metric should an operator "
     "monitor?")),
    (("Which of these is the main benefit of auto scaling for a web application with "
     "unpredictable traffic?"),
     ("What is the main advantage of auto scaling for a web application whose traffic is "
     "unpredictable?")),
    ("How should a team store database credentials used by a Lambda function?",
     "How should database credentials used by a Lambda function be stored by a team?"),
    (("Which service should be used to distribute 10,000 requests per second across several "
     "EC2 instances?"),
     "Which service distributes 10000 requests per second across several EC2 instances?"),
    ("What does a 99.9% availability target allow in downtime per month?",
     "How much monthly downtime does a 99.9 percent availability target allow?"),
    ("Which practice reduces the blast radius of a faulty deployment?",
     "Which of the following practices limits the blast radius of a faulty deployment?"),
    ("When latency exceeds 250ms for a week, what should the on-call engineer check first?",
     ("What should the on-call engineer check first when latency has exceeded 250 ms for a "
     "week?")),
]

# Pairs that must not be caught: the same template asking a different fact, numbers that
# differ, or another question on the same subject.
MUST_NOT_CATCH: list[tuple[str, str]] = [
    ("What is the default port used by HTTPS?", "What is the default port used by SSH?"),
    (("A company needs to keep its backups for 7 years to meet a regulation. Which storage "
     "class is the most cost-effective choice?"),
     ("A company needs to keep its backups for 30 days to meet a regulation. Which storage "
     "class is the most cost-effective choice?")),
    ("How many availability zones must a highly available design span at least?",
     "How many regions must a disaster recovery design span at least?"),
    ("What does a 99.9% availability target allow in downtime per month?",
     "What does a 99.99% availability target allow in downtime per month?"),
    ("Which DynamoDB feature provides automatic backups?",
     "Which RDS feature provides automatic backups?"),
    (("Which metric should an operator watch to detect that an application is running out of "
     "memory?"),
     "Which log should an operator read to find why an application crashed at startup?"),
    ("What should a team do first when a deployment fails?",
     "What should a team do first when a security review finds exposed credentials?"),
    ("Which service should be used to distribute traffic across several EC2 instances?",
     "Which service should be used to run containers without managing EC2 instances?"),
]


# What only the edit path catches (EDIT_THRESHOLD): the same sentence in British and American
# spelling, or with typos. Each spelling is another word to the Jaccard of stems (0.27-0.45
# here), while the texts are 95-97 % the same.
EDIT_ONLY_CATCH: list[tuple[str, str]] = [
    ("How should a team optimise the behaviour of a caching centre when analysing logs?",
     "How should a team optimize the behavior of a caching center when analyzing logs?"),
    ("Which colour-coded dashboard helps an organisation prioritise the alarms it receives?",
     "Which color-coded dashboard helps an organization prioritize the alarms it receives?"),
    ("Which AWS service provides durable object storage for static website assets?",
     "Which AWS servce provides durible objct storage for statik webste assets?"),
]


def test_spelling_variants_and_typos_are_caught_by_the_edit_path_alone() -> None:
    checker = nd.Checker()
    for a, b in EDIT_ONLY_CATCH:
        sa, sb = nd.signature(a, TITLE), nd.signature(b, TITLE)
        assert nd.jaccard(sa.tokens, sb.tokens) < checker.threshold, (a, b)
        assert nd.edit_similarity(sa, sb) >= nd.EDIT_THRESHOLD and checker.is_near(sa, sb)
    # And the edit path stays clear of what must be kept (a swapped key term, such as HTTPS
    # and SSH, keeps the others apart before any measure).
    for a, b in MUST_NOT_CATCH:
        sa, sb = nd.signature(a, TITLE), nd.signature(b, TITLE)
        if not nd.swapped(sa, sb):
            assert nd.edit_similarity(sa, sb) < nd.EDIT_THRESHOLD, (a, b)


# Beyond a measure of words: one ordinary word swapped changes the fact asked, exactly as a
# synonym swap changes none ("reduces" / "limits" above). These are caught (a false
# positive): the cost is one question asked again, where a missed repeat stays in the bank.
KNOWN_FALSE_POSITIVES: list[tuple[str, str]] = [
    ("Which AWS service provides object storage?",
     "Which AWS service provides block storage for EC2 instances?"),
    ("Which of the following is the best way to secure data at rest in S3?",
     "Which of the following is the best way to secure data in transit to S3?"),
]


def _mock_pairs(n: int = 120) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The mock's rewordings (to catch) and its distinct questions nearest one another (not
    to catch): every paraphrase of the first `n` questions, and the 30 closest distinct pairs
    of a 300-question chapter."""
    texts = [mq.make_question(KEY, TITLE, s)["question"] for s in range(1, 301)]
    catch = [(mq.reword(KEY, TITLE, s, v)["question"], texts[s - 1])
             for s in range(1, n + 1) for v in range(4)]
    sigs = [nd.signature(t, TITLE) for t in texts]
    closest = sorted(itertools.combinations(range(300), 2),
                     key=lambda p: -nd.similarity(sigs[p[0]], sigs[p[1]]))[:30]
    return catch, [(texts[i], texts[j]) for i, j in closest]


def _scores(pairs: list[tuple[str, str]], measure: str) -> list[float]:
    if measure == "jaccard":
        return [nd.similarity(nd.signature(a, TITLE), nd.signature(b, TITLE)) for a, b in pairs]
    scorer = {"token_sort_ratio": fuzz.token_sort_ratio, "token_set_ratio": fuzz.token_set_ratio,
              "ratio": fuzz.ratio}[measure]
    return [scorer(a, b, processor=str.lower) / 100 for a, b in pairs]


def test_the_threshold_separates_the_labelled_pairs() -> None:
    mock_catch, mock_keep = _mock_pairs()
    checker = nd.Checker()

    def near(a: str, b: str) -> bool:
        return checker.is_near(nd.signature(a, TITLE), nd.signature(b, TITLE))

    for a, b in MUST_CATCH:
        assert near(a, b), (a, b)
    for a, b in MUST_NOT_CATCH + mock_keep:
        assert not near(a, b), (a, b)
    for a, b in KNOWN_FALSE_POSITIVES:
        assert near(a, b), (a, b)  # the documented limit still holds
    # The mock's rewordings: all but the few that say most of the sentence in other words.
    caught = sum(near(a, b) for a, b in mock_catch)
    assert caught >= 0.99 * len(mock_catch), (caught, len(mock_catch))


def _errors(catch: list[float], keep: list[float], threshold: float) -> int:
    return sum(s < threshold for s in catch) + sum(s >= threshold for s in keep)


@pytest.mark.parametrize("measure", ["jaccard", "token_sort_ratio", "token_set_ratio", "ratio"])
def test_compare_measures_on_the_labelled_pairs(measure: str) -> None:
    """The comparison behind the choice in examforge/neardup.py's docstring: the fewest
    labelled pairs each measure gets wrong at its best threshold (printed with -s). The
    Jaccard of signatures at NEAR_DUP_THRESHOLD's default does at least as well as any of
    rapidfuzz's scorers at theirs."""
    mock_catch, mock_keep = _mock_pairs()
    catch, keep = MUST_CATCH + mock_catch, MUST_NOT_CATCH + mock_keep

    def best(m: str) -> tuple[int, float]:
        c, k = _scores(catch, m), _scores(keep, m)
        return min((_errors(c, k, t / 100), t / 100) for t in range(20, 101))

    errors, threshold = best(measure)
    ours = _errors(_scores(catch, "jaccard"), _scores(keep, "jaccard"), nd.DEFAULT_THRESHOLD)
    print(f"\n{measure}: {errors} of {len(catch) + len(keep)} labelled pairs wrong at its best "
          f"threshold {threshold:.2f} (Jaccard of signatures at {nd.DEFAULT_THRESHOLD}: {ours})")
    assert ours <= errors
    assert ours <= 0.01 * len(catch)


def test_numbers_are_compared_by_value_not_by_spelling() -> None:
    a = nd.signature("Keep 1,000 snapshots for seven days at 99.9% durability, 250ms apart")
    b = nd.signature("keep 1000 snapshots for 7 days at 99.9 percent durability 250 ms apart")
    assert a == b and {"1000", "7", "99.9", "250"} <= a.keys


def test_number_words_in_any_case_and_compounds_become_one_number() -> None:
    a = nd.signature("Twenty-Five users in Sixty-One regions, twelve zones, sixteen racks")
    b = nd.signature("25 users in 61 regions, 12 zones, 16 racks")
    c = nd.signature("twenty five users in sixty one regions, a dozen zones, sixteen racks")
    assert a == b == c and {"25", "61", "12", "16"} <= a.keys
    # A number word inside another word is a word: "often" holds "ten", "someone" "one".
    assert nd.signature("Someone often forgets") == nd.signature("someone often forgets")
    assert not {"10", "1"} & nd.signature("Someone often forgets").keys


def test_a_swapped_fact_is_not_a_near_duplicate_but_a_spelled_out_one_is() -> None:
    ssh = nd.signature("What is the default port used by SSH?")
    https = nd.signature("What is the default port used by HTTPS?")
    assert nd.jaccard(ssh.tokens, https.tokens) >= 0.6 and nd.similarity(ssh, https) == 0.0
    sre = nd.signature("Which alert should an SRE silence first?")
    spelled = nd.signature("Which alert should a site reliability engineer silence first?")
    assert not nd.swapped(sre, spelled)


def test_band_keys_find_similar_questions_and_almost_never_others() -> None:
    """The LSH layout: a pair shares a band key with probability 1-(1-J^ROWS)^BANDS."""
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(2000)]

    def shared(j: float, trials: int = 200) -> float:
        hits = 0
        for _ in range(trials):
            base = rng.sample(vocab, 40)
            # Two sets of 40 with Jaccard j: keep k common words, replace the rest.
            k = round(80 * j / (1 + j))
            other = base[:k] + rng.sample([w for w in vocab if w not in base], 40 - k)
            a, b = nd.Signature(frozenset(base), frozenset()), nd.Signature(frozenset(other),
                                                                            frozenset())
            hits += bool(set(nd.band_keys(a)) & set(nd.band_keys(b)))
        return hits / trials

    assert shared(0.6) >= 0.97
    assert shared(0.45) >= 0.85
    assert shared(0.05) <= 0.05
    assert len(nd.band_keys(nd.signature("What is the default port used by HTTPS?"))) == nd.BANDS
    assert all(0 <= k < 2**63 for k in nd.band_keys(nd.signature("a question about storage")))


def test_the_settings_choose_the_scope_and_off_checks_nothing(make_settings) -> None:  # type: ignore[no-untyped-def]
    from runner.pipeline import near_dup_checker

    assert near_dup_checker(make_settings()) == nd.Checker(0.5, nd.Scope.chapter)
    assert near_dup_checker(make_settings(near_dup_scope="exam", near_dup_threshold=0.7)) == \
        nd.Checker(0.7, nd.Scope.exam)
    assert near_dup_checker(make_settings(near_dup_scope="off")) is None


def test_the_in_memory_band_index_finds_keys_before_and_after_a_merge() -> None:
    from storage.neardup import _BandIndex

    idx = _BandIndex(epoch=1)
    rows = [(qid, struct.pack("<64Q", *[(qid * 1000 + b) for b in range(64)]))
            for qid in range(1, 201)]
    idx.add(rows[:4])
    assert idx.recent_n == 256 and len(idx.keys) == 0  # not merged yet
    assert idx.lookup([3 * 1000 + 5, 2 * 1000 + 63, 10**9]) == {2, 3}
    idx.add(rows[4:])  # 12,800 keys: merged into the sorted arrays
    assert idx.recent_n == 0 and len(idx.keys) == 200 * 64
    assert idx.lookup([7 * 1000 + 63]) == {7}
    idx.add([(201, struct.pack("<2Q", 3 * 1000 + 5, 555))])  # a shared key, in `recent`
    assert idx.lookup([3 * 1000 + 5]) == {3, 201}
    assert idx.lookup([150 * 1000, 555, 42]) == {150, 201}
    assert idx.max_id == 201
    # Three questions sharing a key while it is recent, and after their merge.
    idx.add([(202, struct.pack("<2Q", 777, 778)), (203, struct.pack("<1Q", 777)),
             (204, struct.pack("<2Q", 777, 777))])
    assert idx.recent_n and idx.lookup([777]) == {202, 203, 204}
    assert idx.lookup([778, 3 * 1000 + 5]) == {202, 3, 201}
    idx._merge()
    assert idx.recent_n == 0 and idx.lookup([777]) == {202, 203, 204}
    assert idx.lookup([778, 3 * 1000 + 5, 10**9]) == {202, 3, 201}


def test_the_indexes_of_a_process_keep_at_most_their_budget_of_keys(monkeypatch) -> None:
    from storage.neardup import _Indexes

    registry = _Indexes()
    monkeypatch.setattr(_Indexes, "CACHE_KEYS", 64 * 10)
    blob = struct.pack("<64Q", *range(64))
    scopes = [("db", "ex", f"ch{i}") for i in range(4)]
    for i, where in enumerate(scopes):
        idx = registry.get(where, epoch=7)
        idx.add([(n, blob) for n in range(4 * i + 1, 4 * i + 5)])  # 4 questions each
        registry.grew(where, idx)
    # 16 questions' keys against room for 10: the two least recently used scopes are gone.
    assert list(registry._by_scope) == scopes[2:] and registry._keys == 64 * 8
    assert registry.get(scopes[3], epoch=7).size == 64 * 4  # kept as it was
    assert registry.get(scopes[3], epoch=8).size == 0  # a new epoch: built afresh
    assert registry._keys == 64 * 4


def test_our_minhash_estimates_jaccard_as_well_as_datasketchs() -> None:
    """The MinHash computed here (datasketch's affine32 scheme, without importing datasketch
    and scipy in every worker) estimates the Jaccard of random sets as closely as datasketch's
    own MinHash of 256 permutations, the reference kept in the tests."""
    from datasketch import MinHash

    rng = random.Random(11)
    vocab = [f"w{i}" for i in range(5000)]
    ours, theirs = [], []
    for _ in range(300):
        j = rng.random()
        base = rng.sample(vocab, 30)
        k = round(60 * j / (1 + j))
        other = base[:k] + rng.sample([w for w in vocab if w not in base], 30 - k)
        a, b = nd.Signature(frozenset(base), frozenset()), nd.Signature(frozenset(other),
                                                                        frozenset())
        exact = nd.jaccard(a.tokens, b.tokens)
        ours.append(abs(nd.estimate_jaccard(a, b) - exact))
        ma, mb = (MinHash(num_perm=nd.NUM_PERM, seed=3) for _ in range(2))
        ma.update_batch(t.encode() for t in a.tokens)
        mb.update_batch(t.encode() for t in b.tokens)
        theirs.append(abs(ma.jaccard(mb) - exact))
    # The standard error of an estimate from 256 minima is at most 0.5 / 16 = 0.031.
    assert statistics.mean(ours) < 0.035 and max(ours) < 0.15
    assert statistics.mean(ours) < statistics.mean(theirs) * 1.25
    # The keys do not depend on the order of the tokens, nor on anything but them.
    a = nd.Signature(frozenset(["storage", "object", "durable"]), frozenset())
    b = nd.Signature(frozenset(["durable", "object", "storage"]), frozenset(["s3"]))
    assert nd.band_keys(a) == nd.band_keys(b)


def _texts(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_the_questions_just_received_replace_the_newest_and_the_sample_stays():
    from storage.neardup import Steering

    # The defaults (40 listed, 10 a call), with the model repeating itself a lot: the store
    # picked 20 repeated, 10 newest and 10 of a sample rotating over the chapter.
    picked = Steering(_texts("s", 10), _texts("n", 10), _texts("r", 20))
    assert list(picked) == [*_texts("s", 10), *_texts("n", 10), *_texts("r", 20)]
    fresh = _texts("f", 10)
    listed = picked.with_fresh(fresh, 40)
    assert len(listed) == 40
    assert set(listed) == {*_texts("s", 10), *fresh, *_texts("r", 20)}
    # A batch as long as the list (20 listed, 20 a call) still leaves a quarter to the sample
    # and half to the repeated ones: the prompt covers more than the last batch.
    small = Steering(_texts("s", 5), _texts("n", 5), _texts("r", 10))
    listed = small.with_fresh(_texts("f", 20), 20)
    assert len(listed) == 20 and set(_texts("s", 5)) <= set(listed)
    assert set(_texts("r", 10)) <= set(listed) and set(_texts("f", 20)[-5:]) <= set(listed)
    # Room the repeated ones leave goes to the newest, then to more of the sample.
    few = Steering(_texts("s", 30), _texts("n", 2), ())
    assert few.with_fresh(["f"], 10) == [*_texts("s", 7), "n0", "n1", "f"]
    assert Steering().with_fresh(["a"], 0) == []


def test_newest_only_steering_keeps_the_newest_with_the_fresh_ones():
    from storage.neardup import Steering

    listed = Steering(newest=_texts("n", 20)).with_fresh(_texts("f", 5), 20)
    assert listed == [*_texts("n", 20)[5:], *_texts("f", 5)]
    # A question in two parts is listed once, in its most important part.
    both = Steering(["x", "s"], ["x", "n"], ["x"])
    assert list(both) == ["s", "n", "x"]


def test_band_keys_for_a_whole_reply_equal_the_keys_one_by_one():
    # The commit signs a reply in one vectorised pass (issue 19): the stored keys must be the
    # ones a signature signed alone gets, empty signatures included.
    from examforge.neardup import band_keys, band_keys_many, signature

    texts = ["What does S3 stand for in AWS?", "", "the the of", "Which port does HTTPS use?",
             "Name 3 benefits of IAM roles over 42 access keys", "What is EC2 used for?"]
    sigs = [signature(t, "Amazon Web Services") for t in texts]
    assert band_keys_many(sigs) == [band_keys(s) for s in sigs]
    assert band_keys_many([]) == []
