"""A review a department can work through (issue 30), in a real headless chromium against a
real `python -m producer serve --local`: a reviewer (the role GET /me answers) sees no run
control, filters to the disputed questions, the filter survives a reload, and one bulk
approve approves them all but the one another reviewer saved meanwhile, whose 409 is shown
on its card; the keys move, approve, edit and reject; and a 500-question chapter opens in
the browser in well under the issue's second (measured; asserted generously on a loaded
machine). The database is checked after each step; the view's picture is the review
how-to's docs/img/review-filters.png."""

from __future__ import annotations

import json
import statistics
from typing import Any

import httpx
import pytest

from examforge.output import Question
from examforge.syllabus import parse_syllabus
from harness import ROOT
from helpers import wait_for
from live_api import TOKEN, LiveApi, serve
from screenshots import element_shot, keep_for_docs
from test_api_browser import _el, _els, _posts, browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

OTHER = "tok-second-reviewer"
SCREENSHOT = ROOT / "docs" / "img" / "review-filters.png"
# What GET /me answers in the page for a reviewer: the page is written against that shape
# (issue 30's named tokens), whatever token the server was given.
REVIEWER = {"name": "Ada Lovelace", "role": "reviewer", "exams": None}
_ANSWER_ME = """(() => {
  const answer = %s;
  const real = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const url = new URL(typeof input === "string" ? input : input.url, location.href);
    if (url.pathname === "/me") {
      return new Response(JSON.stringify(answer),
                          {headers: {"Content-Type": "application/json"}});
    }
    return real(input, init);
  };
})();"""


def _exam(api: LiveApi, slug: str, chapters: list[tuple[str, int]]) -> None:
    """The exam's syllabus through the API, and its questions stored through the store
    directly (as an import would): no model call, the test is about the review."""
    syllabus = {"title": "Networks", "chapters": [
        {"id": cid, "title": f"Chapter {cid}", "questions": n} for cid, n in chapters]}
    with api.client() as c:
        assert c.put(f"/exams/{slug}", json=syllabus).status_code == 201
    store = api.dep.store
    store.sync_exam(slug, parse_syllabus(json.dumps(syllabus).encode(), "syllabus.json",
                                         max_questions=5000))
    store.import_questions(slug, {cid: [Question(
        f"In chapter {cid}, which statement number {i} about routing holds?",
        (f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"), i % 4,
        f"Because of rule {i}.") for i in range(n)] for cid, n in chapters}, "test")


def _verdicts(api: LiveApi, slug: str, disputed: list[int]) -> None:
    """Verdicts as the blind solve books them: every question agreed but `disputed`."""
    from sqlalchemy import update

    from storage.base import Q

    with api.dep.store.engine.begin() as conn:
        conn.execute(update(Q).where(Q.c.exam == slug).values(
            verdict="agreed", solved_index=Q.c.answer_index))
        conn.execute(update(Q).where(Q.c.id.in_(disputed)).values(
            verdict="disputed", solved_index=(Q.c.answer_index + 1) % 4))


def _login(driver: Any, api: LiveApi, slug: str) -> Any:
    driver.get(api.url + "/")
    wait_for(lambda: _el(driver, "#login").is_displayed(), 20, "the token form")
    _el(driver, "#token").send_keys(api.token)
    _el(driver, "#login-go").click()
    return wait_for(lambda: (_els(driver, f'[data-exam="{slug}"]') or [None])[0], 20,
                    "the exam's card")


def _cards(driver: Any) -> list[Any]:
    return [c for c in _els(driver, "#r-chapters article.rq") if c.is_displayed()]


def _card(driver: Any, qid: int) -> Any:
    return _el(driver, f'article.rq[data-id="{qid}"]')


def _review_of(driver: Any, qid: int) -> str:
    return _card(driver, qid).get_attribute("data-review")


def _filter(driver: Any, name: str) -> Any:
    return _el(driver, f'#r-filters button[data-filter="{name}"]')


def test_a_reviewer_filters_to_disputed_and_bulk_approves_but_a_question_changed_meanwhile(
        deploy, browser):  # noqa: F811
    dep = deploy("sqlite")
    api = serve(dep, "--local", API_TOKENS=f"{TOKEN},{OTHER}")
    slug = "net"
    _exam(api, slug, [("ch-1", 6), ("ch-2", 4)])
    store = dep.store
    ch1 = store.chapter_questions(slug, "ch-1")[1]
    ch2 = store.chapter_questions(slug, "ch-2")[1]
    disputed = [ch1[0]["id"], ch1[2]["id"], ch1[5]["id"], ch2[1]["id"]]
    _verdicts(api, slug, disputed)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                            {"source": _ANSWER_ME % json.dumps(REVIEWER)})

    # Who you are, and only what a reviewer may do: no run control on the exam's card.
    card = _login(browser, api, slug)
    wait_for(lambda: _el(browser, "#me-role").text == "reviewer", 10, "the role shown")
    assert _el(browser, "#me-name").text == "Ada Lovelace"
    for control in (".start", ".cancel", ".resume", ".budget-input", ".batch-input"):
        assert not _el(card, control).is_displayed(), control
    assert _el(card, ".show-review").is_displayed()

    # Filter to the disputed ones: the filter and its count, kept in the URL.
    _el(card, ".show-review").click()
    wait_for(lambda: len(_cards(browser)) == 10, 20, "the review's questions")
    wait_for(lambda: _el(_filter(browser, "disputed"), ".n").text == "4", 10, "the counts")
    assert _el(_filter(browser, "unreviewed"), ".n").text == "10"
    assert _el(_filter(browser, "approved"), ".n").text == "0"
    _filter(browser, "disputed").click()
    wait_for(lambda: len(_cards(browser)) == 4, 20, "the disputed questions")
    assert sorted(int(c.get_attribute("data-id")) for c in _cards(browser)) == sorted(disputed)
    assert "filter=disputed" in browser.current_url and f"review={slug}" in browser.current_url
    # The solver's choice beside the key.
    first = ch1[0]
    letters = "ABCD"
    assert _el(_card(browser, first["id"]), ".rq-solved").text == (
        f"solver chose {letters[(first['answer_index'] + 1) % 4]}, "
        f"key {letters[first['answer_index']]}")
    picked = _el(_card(browser, first["id"]), "li.solved")
    assert picked.text.startswith("solver's pick →")
    assert picked.text.endswith(first["choices"][(first["answer_index"] + 1) % 4])
    browser.refresh()  # a reload keeps the review and its filter
    wait_for(lambda: len(_cards(browser)) == 4 and _filter(browser, "disputed")
             .get_attribute("aria-pressed") == "true", 20, "the filtered view after a reload")

    # Another reviewer saves one of them after the page read it; one bulk approve.
    changed = ch1[2]["id"]
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {OTHER}"}) as c:
        theirs = c.patch(f"/exams/{slug}/questions/{changed}", headers={"If-Match": '"1"'},
                         json={"explanation": "The other reviewer's reason."})
        assert theirs.status_code == 200, theirs.text
    browser.get_log("performance")  # drop what loading the page sent
    bulk = _el(browser, "#r-bulk")
    assert bulk.text == "approve the 4 shown"
    bulk.click()
    wait_for(lambda: "3 approved" in _el(browser, "#r-bulk-result").text, 20, "the bulk result")
    assert "1 not approved" in _el(browser, "#r-bulk-result").text
    [post] = _posts(browser, f"/exams/{slug}/review/approve")  # one request for all four
    assert sorted(json.loads(post["postData"])["items"], key=lambda i: i["id"]) == [
        {"id": qid, "version": 1} for qid in sorted(disputed)]
    box = _el(_card(browser, changed), ".rq-conflict")
    assert box.is_displayed() and "409" in box.text
    assert "version 1" in box.text and "version 2" in box.text, box.text
    assert _el(_card(browser, changed), ".rq-expl").text == "The other reviewer's reason."
    assert _review_of(browser, changed) == "unreviewed"
    for qid in disputed:
        now = store.review_question(slug, qid)
        assert now["review"] == ("unreviewed" if qid == changed else "approved"), qid
        assert _review_of(browser, qid) == now["review"]
    wait_for(lambda: _el(_filter(browser, "approved"), ".n").text == "3", 10, "the new counts")
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    _save_screenshot(browser, dep.workdir / "review-filters.png")

    # The keys: j next, k previous, a approve (and on), e edit, Esc, R reject.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def keys(*pressed: str) -> None:
        ActionChains(browser).send_keys(*pressed).perform()

    assert "j" in _el(browser, "#r-keys").text and "approve" in _el(browser, "#r-keys").text
    _filter(browser, "unreviewed").click()
    wait_for(lambda: len(_cards(browser)) == 7, 20, "the unreviewed questions")
    order = [int(c.get_attribute("data-id")) for c in _cards(browser)]
    _el(browser, "#r-totals").click()  # the keys go to the page, not to a button
    keys("j")
    assert "rq-current" in _card(browser, order[0]).get_attribute("class")
    keys("a")
    wait_for(lambda: _review_of(browser, order[0]) == "approved", 10, "approved by its key")
    assert "rq-current" in _card(browser, order[1]).get_attribute("class")
    keys("k")
    assert "rq-current" in _card(browser, order[0]).get_attribute("class")
    keys("j", "j", "e")
    form = _el(_card(browser, order[2]), ".rq-form")
    assert form.is_displayed()
    assert browser.switch_to.active_element == _el(_card(browser, order[2]), ".rq-f-question")
    keys("x", Keys.ESCAPE)  # typing in the form is no key of the view; Esc closes it
    assert not form.is_displayed()
    assert store.review_question(slug, order[2])["review"] == "unreviewed"
    keys("R")
    wait_for(lambda: _review_of(browser, order[2]) == "rejected", 10, "rejected by its key")
    assert store.review_question(slug, order[0])["review"] == "approved"
    assert store.review_question(slug, order[2])["review"] == "rejected"
    assert store.review_question(slug, order[1])["review"] == "unreviewed"


def test_the_role_decides_what_the_page_offers(deploy, browser):  # noqa: F811
    """The role check is a function of GET /me's answer alone (allows(role, needed))."""
    dep = deploy("sqlite")
    api = serve(dep, "--local")
    slug = "net"
    _exam(api, slug, [("ch-1", 2)])
    card = _login(browser, api, slug)
    # The stub's admin: everything offered.
    wait_for(lambda: _el(browser, "#me-role").text == "admin", 10, "the role shown")
    assert _el(card, ".start").is_displayed()
    table = browser.execute_script("""
        const roles = ["reader", "reviewer", "operator", "admin", "nobody"];
        return roles.map((r) => [r, allows(r, "reviewer"), allows(r, "operator")]);""")
    assert table == [["reader", False, False], ["reviewer", True, False],
                     ["operator", True, True], ["admin", True, True], ["nobody", False, False]]
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {
        "source": _ANSWER_ME % json.dumps({"name": "Guest", "role": "reader", "exams": [slug]})})
    browser.refresh()
    card = wait_for(lambda: (_els(browser, f'[data-exam="{slug}"]') or [None])[0], 20,
                    "the exam's card")
    wait_for(lambda: _el(browser, "#me-role").text == "reader", 10, "the reader's role")
    assert not _el(card, ".start").is_displayed()
    _el(card, ".show-review").click()
    wait_for(lambda: len(_cards(browser)) == 2, 20, "the review's questions")
    assert not _el(browser, "#r-bulk").is_displayed()
    assert not any(_el(c, ".rq-approve").is_displayed() for c in _cards(browser))


def test_a_500_question_chapter_opens_in_under_a_second(deploy, browser):  # noqa: F811
    """Timed from the navigation to the mark the page sets once the last card is laid out
    (performance.mark("review-rendered")): the page, GET /me, the review's summary and the
    chapter's 500 questions, and their cards. A test asserts no absolute time on a shared
    2-core machine (CI once saw 3.1 s where a quiet run takes 0.9 s): the 500-card chapter is
    measured against a 100-card one in the same run, interleaved: the median of four warm
    pairs' ratios (not the best: a run now and then marks a 500-card render at 0.2 s, before
    its layout), under 15.
    Quiet, the ratio is 5.5 to 6 (0.8 s against 0.14 s: a taller page lays out a little
    worse than linearly); a fetch per card, or layout quadratic in the cards, is near 25.
    The absolute figures are printed for the docs."""
    dep = deploy("sqlite")
    api = serve(dep, "--local")
    _exam(api, "big", [("ch-1", 500)])
    _exam(api, "small", [("ch-1", 100)])
    _verdicts(api, "big", [q["id"] for q in dep.store.chapter_questions("big", "ch-1")[1][::7]])
    _login(browser, api, "big")  # the token, kept by the tab

    def rendered(slug: str, cards: int) -> float:
        browser.get("about:blank")
        browser.get(f"{api.url}/#review={slug}")
        wait_for(lambda: len(_els(browser, "#r-chapters article.rq")) == cards, 30,
                 f"the chapter's {cards} cards")
        return float(wait_for(lambda: browser.execute_script(
            "const m = performance.getEntriesByName('review-rendered');"
            "return m.length ? m[0].startTime : null;"), 10, "the rendered mark"))

    big, small = [], []
    for _ in range(5):  # the first of each is cold (the server's first reads, the cache)
        big.append(rendered("big", 500))
        small.append(rendered("small", 100))
    print(f"\n500-question chapter rendered in {', '.join(f'{f:.0f}' for f in big)} ms, "
          f"a 100-question one in {', '.join(f'{f:.0f}' for f in small)} ms after navigation")
    # Each warm pair's ratio, the two renders next to each other in time, so under the same
    # load: a full suite's load once made two of three 500-card renders 6 s (12x the medians).
    ratios = sorted(b / s for b, s in zip(big[1:], small[1:]))
    assert statistics.median(ratios) < 15, (big, small)
    rendered("big", 500)
    assert len(_els(browser, '.rq-verdict[data-verdict="disputed"]')) == 72


def _save_screenshot(driver: Any, path: Any) -> None:
    """The filtered view, for the how-to's docs/img/review-filters.png (screenshots.py)."""
    element_shot(driver, _el(driver, "#review"), path)
    keep_for_docs(path, SCREENSHOT)
