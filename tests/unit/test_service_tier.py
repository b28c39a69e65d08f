"""LLM_SERVICE_TIER (issue 18, flex): what is sent, how long a call may take, what a call is
priced and booked at, and what flex's "resource unavailable" 429 does to a chapter."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fakellm import reply
from sqlalchemy import select

from examforge.classify import Action as Rule
from examforge.errors import CapacityUnavailable, ErrorKind, RateLimited, SliceReason
from examforge.llm import LLMClient
from runner.pipeline import process_chapter
from examforge.retry import Action, decide
from helpers import fake_runtimes
from storage.base import E, K

MESSAGES = [{"role": "user", "content": "hi"}]
PRICES = {"llm_price_prompt_per_mtok": 1.0, "llm_price_completion_per_mtok": 2.0}
FLEX_429 = {"error": {"message": "Resource unavailable: flex capacity is exhausted right now; "
                                 "retry later, or use the default service tier.",
                      "type": "rate_limit_error", "code": "resource_unavailable",
                      "param": None}}


def _replying(tier: str | None, seen: list[httpx.Request] | None = None,
              prompt: int = 1000, completion: int = 500):
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        body = {"id": "x", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
        if tier is not None:
            body["service_tier"] = tier
        return httpx.Response(200, json=body)
    return httpx.MockTransport(handle)


def _sent(request: httpx.Request) -> dict:
    return json.loads(request.content)


# ---------------------------------------------------------------- the request
@pytest.mark.parametrize(("tier", "sent"), [("auto", None), ("default", "default"),
                                            ("flex", "flex"), ("priority", "priority")])
def test_the_tier_is_sent_only_when_set_explicitly(make_settings, tier, sent):
    seen: list[httpx.Request] = []
    client = LLMClient(make_settings(llm_service_tier=tier), transport=_replying("default", seen))
    client.complete(MESSAGES, max_tokens=10)
    body = _sent(seen[0])
    assert body.get("service_tier") == sent
    assert ("service_tier" in body) is (sent is not None)  # auto: no field at all


def test_the_fallback_is_never_sent_a_tier(make_settings):
    """The fallback is another server, often a local one that may refuse unknown fields."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host == "primary.invalid":
            raise httpx.ConnectError("refused", request=request)
        seen.append(request)
        return _replying(None).handle_request(request)

    client = LLMClient(make_settings(llm_base_url="http://primary.invalid/v1",
                                     llm_fallback_base_url="http://fallback.invalid/v1",
                                     llm_service_tier="flex"),
                       transport=httpx.MockTransport(handle))
    completion = client.complete(MESSAGES, max_tokens=10)
    assert completion.fallback and "service_tier" not in _sent(seen[0])


def test_the_setting_is_checked_at_start(make_settings):
    with pytest.raises(ValueError, match="llm_service_tier"):
        make_settings(llm_service_tier="scale")


# ---------------------------------------------------------------- timeouts
def test_a_flex_call_is_given_the_flex_timeout_and_others_llm_timeout_s(make_settings):
    seen: list[httpx.Request] = []
    flex = make_settings(llm_service_tier="flex", llm_timeout_s=7, llm_flex_timeout_s=600)
    LLMClient(flex, transport=_replying("flex", seen)).complete(MESSAGES, max_tokens=10)
    assert seen[0].extensions["timeout"]["read"] == 600
    assert flex.call_timeout_s == 600
    default = make_settings(llm_service_tier="priority", llm_timeout_s=7, llm_flex_timeout_s=600)
    LLMClient(default, transport=_replying("priority", seen)).complete(MESSAGES, max_tokens=10)
    assert seen[1].extensions["timeout"]["read"] == 7
    assert default.call_timeout_s == 7


def test_a_flex_deadline_names_the_flex_timeout(make_settings):
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no reply", request=request)

    client = LLMClient(make_settings(llm_service_tier="flex", llm_flex_timeout_s=321, **PRICES),
                       transport=httpx.MockTransport(slow))
    with pytest.raises(Exception) as info:
        client.complete(MESSAGES, max_tokens=100)
    assert "LLM_FLEX_TIMEOUT_S=321s" in str(info.value)
    # Booked at its worst case at the tier it was sent at, as it was reserved.
    billed = info.value.billed
    assert billed.estimated and billed.cost_usd == pytest.approx(
        client.worst_case_usd(billed.prompt_tokens, 100), rel=0.2)


# ---------------------------------------------------------------- prices
@pytest.mark.parametrize(("asked", "reported", "factor"), [
    ("flex", "flex", 0.5),
    ("flex", "default", 1.0),  # the tier the reply reports is what is booked
    ("auto", "priority", 2.0),  # a project whose default tier is priority
    ("auto", "default", 1.0),
    ("priority", "priority", 2.0),
    ("default", "scale", 1.0),  # a tier without a factor: the standard price
    ("flex", None, 1.0),  # no tier reported: a server without tiers bills its one price
    ("priority", None, 2.0),  # ... never below what was asked for when that is dearer
    ("auto", None, 1.0),
])
def test_a_call_is_priced_at_the_tier_its_reply_reports(make_settings, asked, reported, factor):
    client = LLMClient(make_settings(llm_service_tier=asked, **PRICES),
                       transport=_replying(reported))
    completion = client.complete(MESSAGES, max_tokens=10)
    standard = (1000 * 1.0 + 500 * 2.0) / 1e6
    assert completion.cost_usd == pytest.approx(standard * factor)
    assert completion.service_tier == reported


OPENAI = "https://api.openai.com/v1"


def _data_price(model: str, tier: str) -> tuple[float, float]:
    """(prompt, completion) USD per Mtok of `model` at `tier` in the bundled price data."""
    from genai_prices import Usage, calc_price

    mp = calc_price(Usage(input_tokens=0, output_tokens=0), model, provider_id="openai",
                    price_context={"service_tier": tier}).model_price
    return float(mp.input_mtok), float(mp.output_mtok)


@pytest.mark.parametrize(("model", "tier"), [("gpt-4.1", "priority"), ("gpt-5-mini", "priority"),
                                             ("o3", "flex")])
def test_a_tier_is_priced_from_the_price_data_where_it_has_that_tiers_price(
        make_settings, model, tier):
    """genai-prices carries OpenAI's per-tier prices: priority is 1.7x to 2x standard
    depending on the model (GPT-4.1: 1.75x), so a flat factor would book the wrong cost."""
    prompt, completion = _data_price(model, tier)
    client = LLMClient(make_settings(llm_model=model, llm_base_url=OPENAI, llm_service_tier=tier),
                       transport=_replying(tier))
    expected = (1000 * prompt + 500 * completion) / 1e6
    assert client.complete(MESSAGES, max_tokens=10).cost_usd == pytest.approx(expected)
    assert client.worst_case_usd(1000, 500) == pytest.approx(expected)
    # The estimate prices the tier the same way (Settings.price_at).
    settings = make_settings(llm_model=model, llm_base_url=OPENAI, llm_service_tier=tier)
    assert settings.price_at(tier).cost_usd(1000, 500) == pytest.approx(expected)


def test_gpt_4_1_priority_is_not_the_flat_factor(make_settings):
    prompt, completion = _data_price("gpt-4.1", "priority")
    standard = _data_price("gpt-4.1", "default")
    assert prompt != pytest.approx(standard[0] * 2.0)  # the test above means something
    client = LLMClient(make_settings(llm_model="gpt-4.1", llm_base_url=OPENAI,
                                     llm_service_tier="priority"),
                       transport=_replying("priority"))
    assert client.complete(MESSAGES, max_tokens=10).cost_usd != pytest.approx(
        (1000 * standard[0] + 500 * standard[1]) / 1e6 * 2.0)


def test_a_tier_the_data_has_no_price_for_falls_back_to_the_factor(make_settings):
    """The price data has no flex price for gpt-4o-mini, and LLM_PRICE_* are standard prices:
    both are scaled by the tier's factor."""
    standard = _data_price("gpt-4o-mini", "default")
    client = LLMClient(make_settings(llm_model="gpt-4o-mini", llm_base_url=OPENAI,
                                     llm_service_tier="flex"), transport=_replying("flex"))
    assert client.complete(MESSAGES, max_tokens=10).cost_usd == pytest.approx(
        (1000 * standard[0] + 500 * standard[1]) / 1e6 * 0.5)
    client = LLMClient(make_settings(llm_model="gpt-4.1", llm_base_url=OPENAI,
                                     llm_service_tier="priority", **PRICES),
                       transport=_replying("priority"))
    assert client.complete(MESSAGES, max_tokens=10).cost_usd == pytest.approx(0.002 * 2.0)


def test_the_factors_are_settings(make_settings):
    client = LLMClient(make_settings(llm_service_tier="flex", llm_flex_price_factor=0.25,
                                     **PRICES), transport=_replying("flex"))
    assert client.complete(MESSAGES, max_tokens=10).cost_usd == pytest.approx(0.002 * 0.25)
    settings = make_settings(llm_priority_price_factor=1.75)
    assert settings.tier_factor("priority") == 1.75 and settings.tier_factor("flex") == 0.5
    assert settings.tier_factor("default") == settings.tier_factor(None) == 1.0


def test_the_worst_case_is_reserved_at_the_tier_sent(make_settings):
    def worst(tier: str) -> float:
        return LLMClient(make_settings(llm_service_tier=tier, **PRICES),
                         transport=_replying(None)).worst_case_usd(1000, 500)

    assert worst("flex") == pytest.approx(worst("auto") * 0.5)
    assert worst("priority") == pytest.approx(worst("default") * 2.0)


def test_a_priced_fallback_keeps_its_own_standard_price_in_the_worst_case(make_settings):
    """Flex reserves half at the primary; a fallback (sent no tier) that may serve the call
    is reserved at its full price, whichever is dearer."""
    client = LLMClient(make_settings(llm_service_tier="flex", **PRICES,
                                     llm_fallback_base_url="http://fallback.invalid/v1",
                                     llm_fallback_price_prompt_per_mtok=1.0,
                                     llm_fallback_price_completion_per_mtok=2.0),
                       transport=_replying(None))
    standard = LLMClient(make_settings(**PRICES), transport=_replying(None))
    assert client.worst_case_usd(1000, 500) == pytest.approx(standard.worst_case_usd(1000, 500))


# ---------------------------------------------------------------- flex's 429
def test_flex_capacity_429_is_capacity_unavailable_and_holds_no_other_worker(make_settings):
    client = LLMClient(make_settings(llm_service_tier="flex"), transport=httpx.MockTransport(
        lambda r: httpx.Response(429, json=FLEX_429)))
    for n in (1, 2, 3):
        with pytest.raises(CapacityUnavailable) as info:
            client.complete(MESSAGES, max_tokens=10)
        err = info.value
        assert err.kind is ErrorKind.resource_unavailable and not isinstance(err, RateLimited)
        assert err.in_row == n and err.billed is None  # refused: nothing billed
    # A rate limit's 429 holds the endpoint's shared limiter; flex's holds nothing.
    assert client._primary.limit.limiter.held() == 0


def test_refusals_in_row_start_again_after_a_flex_reply(make_settings):
    replies = iter([httpx.Response(429, json=FLEX_429), httpx.Response(429, json=FLEX_429),
                    None, httpx.Response(429, json=FLEX_429)])
    ok = _replying("flex")

    def handle(request: httpx.Request) -> httpx.Response:
        nxt = next(replies)
        return nxt if nxt is not None else ok.handle_request(request)

    client = LLMClient(make_settings(llm_service_tier="flex"), transport=httpx.MockTransport(handle))
    rows = []
    for _ in range(4):
        try:
            client.complete(MESSAGES, max_tokens=10)
            rows.append(0)
        except CapacityUnavailable as exc:
            rows.append(exc.in_row)
    assert rows == [1, 2, 0, 1]


def test_the_decision_backs_off_uncounted_and_never_pauses(make_settings):
    settings = make_settings(retry_base_s=1.0, retry_max_s=60.0)
    delays = []
    for in_row in (1, 2, 3, 4, 10):
        err = CapacityUnavailable("HTTP 429: Resource unavailable", status_code=429)
        err.in_row = in_row
        d = decide(err, streak=1, settings=settings, rand=1.0)
        assert d.action is Action.release and not d.count_attempt
        assert d.code is SliceReason.flex_unavailable
        delays.append(d.delay_s)
    assert delays == [1.0, 2.0, 4.0, 8.0, 60.0]  # exponential, capped at RETRY_MAX_S
    err = CapacityUnavailable("x", status_code=429, retry_after_s=30.0)
    assert decide(err, streak=1, settings=settings, rand=0.0).delay_s == 30.0  # a floor


def test_the_row_is_retry_in_the_table():
    from examforge.classify import classify

    rule = classify(429, "resource_unavailable", "rate_limit_error", FLEX_429["error"]["message"])
    assert rule.action is Rule.retry and rule.kind is ErrorKind.resource_unavailable


# ---------------------------------------------------------------- the pipeline and ledger
@pytest.fixture
def env(make_settings):
    with fake_runtimes(make_settings) as build:
        yield build


def _calls(rt):
    with rt.store.engine.connect() as conn:
        return conn.execute(select(K.c.outcome, K.c.reason, K.c.service_tier, K.c.cost_usd,
                                   K.c.prompt_tokens, K.c.completion_tokens,
                                   K.c.reserved_usd).order_by(K.c.id)).all()


def _flex_reply(req, n, tier="flex"):
    from fakellm import question

    response = reply(json.dumps({"questions": [question(800 + i) for i in range(n)]}))
    body = json.loads(response.content)
    body["service_tier"] = tier
    return httpx.Response(200, json=body)


def test_flex_refusals_retry_uncounted_never_pause_and_the_tier_is_booked(env):
    rt, fake = env([("a", 5)], llm_service_tier="flex", retry_base_s=0.01, max_attempts=2,
                   **PRICES)
    refused = lambda req, n: httpx.Response(429, json=FLEX_429)  # noqa: E731
    fake.script = [refused] * 4 + [_flex_reply]
    for _ in range(4):
        result = process_chapter(rt, "ex", "a")
        assert result.outcome == "retry" and result.reason is SliceReason.flex_unavailable
        time.sleep(result.retry_in_s + 0.01)
    # Four refusals, an attempt cap of two: alive, never paused.
    status = rt.store.status("ex").as_dict()
    assert status["chapter_list"][0]["attempts_since_progress"] == 0
    with rt.store.engine.connect() as conn:
        assert conn.execute(select(E.c.state).where(E.c.slug == "ex")).scalar_one() != "paused"
    assert process_chapter(rt, "ex", "a").outcome == "done"
    assert fake.calls == 5 and all(r["service_tier"] == "flex" for r in fake.requests)
    rows = _calls(rt)
    assert [(r.outcome, r.reason, r.service_tier, r.cost_usd) for r in rows[:4]] == \
        [("failed", "resource_unavailable", None, 0.0)] * 4
    last = rows[4]
    assert last.outcome == "used" and last.service_tier == "flex"
    assert last.cost_usd == pytest.approx(
        0.5 * (last.prompt_tokens * 1.0 + last.completion_tokens * 2.0) / 1e6)


def test_a_reply_served_at_another_tier_is_booked_at_that_tier(env):
    rt, fake = env([("a", 5)], llm_service_tier="flex", **PRICES)
    fake.script = [lambda req, n: _flex_reply(req, n, tier="default")]
    assert process_chapter(rt, "ex", "a").outcome == "done"
    (row,) = _calls(rt)
    assert row.service_tier == "default"
    assert row.cost_usd == pytest.approx((row.prompt_tokens + 2.0 * row.completion_tokens) / 1e6)


def test_a_slow_flex_reply_past_llm_timeout_s_arrives_within_the_flex_timeout(make_settings,
                                                                              mock_llm):
    """Against the real mock (flex three times slower) and the real transport, whose deadline
    bounds the whole call: a flex call outlives LLM_TIMEOUT_S and is answered, while the same
    wait at the default tier is cut at LLM_TIMEOUT_S."""
    settings = {"llm_base_url": mock_llm.base_url, "llm_model": "mock-model",
                "llm_timeout_s": 0.6, "llm_flex_timeout_s": 10}
    messages = [{"role": "user", "content": "Chapter id: c\nNumber of questions: 1"}]
    mock_llm.configure(latency_s=0.4, flex_latency_factor=3.0)
    flex = LLMClient(make_settings(llm_service_tier="flex", **settings))
    started = time.monotonic()
    completion = flex.complete(messages, max_tokens=300)
    assert completion.service_tier == "flex" and time.monotonic() - started >= 1.0
    flex.close()
    mock_llm.configure(latency_s=1.2)  # the same wait at the default tier
    default = LLMClient(make_settings(llm_service_tier="auto", **settings))
    with pytest.raises(Exception, match=r"LLM_TIMEOUT_S=0.6s"):
        default.complete(messages, max_tokens=300)
    default.close()


def test_a_scaled_price_scales_every_rate_and_an_unknown_one_stays_unknown():
    from examforge.prices import UNKNOWN, Price

    price = Price(1.0, 2.0, "LLM_PRICE_* settings", 0.25)
    flex = price.scaled(0.5, "flex")
    assert (flex.prompt_per_mtok, flex.completion_per_mtok, flex.cached_per_mtok) == \
        (0.5, 1.0, 0.125)
    assert flex.source == "LLM_PRICE_* settings x 0.5 (flex tier)" and flex.known
    assert flex.cost_usd(1000, 500, 400) == pytest.approx(price.cost_usd(1000, 500, 400) / 2)
    assert Price(1.0, 2.0, "s").scaled(2.0).cached_per_mtok == 2.0  # no cached price: prompt's
    assert price.scaled(1.0) is price
    assert UNKNOWN.scaled(0.5) is UNKNOWN and not UNKNOWN.scaled(0.5).known


def test_the_estimate_is_at_the_tier_sent(make_settings, tmp_path):
    from examforge.estimate import estimate
    from examforge.syllabus import load_syllabus
    from helpers import write_syllabus

    syllabus = load_syllabus(write_syllabus(tmp_path / "exams", "ex", [("a", 20)]),
                             max_questions=100)
    auto = estimate("ex", syllabus, make_settings(**PRICES))
    flex = estimate("ex", syllabus, make_settings(llm_service_tier="flex", **PRICES))
    assert flex.worst_usd == pytest.approx(auto.worst_usd / 2)
    assert flex.expected_usd == pytest.approx(auto.expected_usd / 2)


# ---------------------------------------------------------------- batch mode with a tier set
@pytest.mark.parametrize("tier", ["flex", "priority"])
def test_batch_lines_carry_no_tier_and_are_booked_at_the_batch_price_alone(make_settings, tier):
    """A batch is its own processing tier, billed at the Batch API's rates: LLM_SERVICE_TIER
    is for synchronous calls. A batch line sent with a tier (and booked at that tier's price
    times the batch discount: flex 0.25x, priority 1.0x) would be booked apart from what it
    was reserved at, and from the bill."""
    client = LLMClient(make_settings(llm_service_tier=tier, **PRICES), transport=_replying(None))
    assert "service_tier" not in client.batch_body(MESSAGES, 10)
    body = {"id": "x", "object": "chat.completion", "model": "m", "service_tier": tier,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}
    standard = (1000 * 1.0 + 500 * 2.0) / 1e6
    assert client.batch_completion(200, body, 900).cost_usd == pytest.approx(standard * 0.5)
    assert client.batch_worst_case_usd(1000, 500) == pytest.approx(standard * 0.5, rel=0.2)
