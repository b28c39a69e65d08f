"""A Persian exam in the page, in a real headless browser (Debian's chromium through its
chromedriver) against a real `python -m producer serve --local` (issue 31): every question,
choice and explanation element carries the question's `lang` and its direction, so a Persian
question reads right to left (the browser's computed direction), its Latin terms in place,
even where its text starts with one (`dir="auto"` alone read that left to right: the
explanation below starts with "DNS"), while the exam's English chapter, `dir="auto"`, reads
left to right; the questions table does the same.
The view's picture is the syllabus reference's docs/img/review-persian.png."""

from __future__ import annotations

import json
from typing import Any

import pytest

from examforge.output import Question
from examforge.syllabus import parse_syllabus
from harness import ROOT
from helpers import wait_for
from live_api import serve
from screenshots import element_shot, keep_for_docs
from test_api_browser import _el, _els, browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

SLUG = "fa-net"
SCREENSHOT = ROOT / "docs" / "img" / "review-persian.png"
SYLLABUS = {"title": "شبکه‌های رایانه‌ای", "language": "fa", "chapters": [
    {"id": "dns", "title": "سامانه‌ی نام دامنه", "questions": 2},
    {"id": "en", "title": "Routing, in English", "questions": 1, "language": "en"}]}
PERSIAN = [
    Question("کدام رکورد DNS نام دامنه را به یک نشانی IPv4 نگاشت می‌کند؟",
             ("رکورد A", "رکورد MX", "رکورد TXT", "رکورد CNAME"), 0,
             "رکورد A نام را به نشانی IPv4 نگاشت می‌کند؛ MX برای رایانامه است."),
    Question("پروتکل DNS به‌طور پیش‌فرض از کدام درگاه استفاده می‌کند؟",
             ("درگاه ۵۳", "درگاه ۸۰", "درگاه ۴۴۳", "درگاه ۲۲"), 0,
             "DNS روی درگاه ۵۳ با UDP و TCP کار می‌کند."),
]
ENGLISH = [Question("Which device forwards packets between networks?",
                    ("A router", "A hub", "A repeater", "A patch panel"), 0,
                    "A router reads the destination address and picks the next hop.")]


def _direction(driver: Any, el: Any) -> str:
    return driver.execute_script("return getComputedStyle(arguments[0]).direction", el)


def _assert_reads(driver: Any, el: Any, lang: str, direction: str) -> None:
    assert el.get_attribute("lang") == lang, el.get_attribute("outerHTML")
    # Right to left by the language; otherwise by the text (`auto`).
    assert el.get_attribute("dir") == ("rtl" if direction == "rtl" else "auto"), \
        el.get_attribute("outerHTML")
    assert _direction(driver, el) == direction, el.get_attribute("outerHTML")


def test_a_persian_question_reads_right_to_left_in_the_page(deploy, browser):  # noqa: F811
    dep = deploy("sqlite")
    api = serve(dep, "--local")
    with api.client() as c:
        assert c.put(f"/exams/{SLUG}", json=SYLLABUS).status_code == 201
    store = dep.store
    store.sync_exam(SLUG, parse_syllabus(json.dumps(SYLLABUS).encode(), "syllabus.json",
                                         max_questions=100))
    store.import_questions(SLUG, {"dns": PERSIAN, "en": ENGLISH}, "test")

    browser.get(api.url + "/")
    wait_for(lambda: _el(browser, "#login").is_displayed(), 20, "the token form")
    _el(browser, "#token").send_keys(api.token)
    _el(browser, "#login-go").click()
    card = wait_for(lambda: (_els(browser, f'[data-exam="{SLUG}"]') or [None])[0], 20,
                    "the exam's card")
    _el(card, ".show-review").click()
    wait_for(lambda: len(_els(browser, "article.rq")) == 3, 20, "the review's questions")

    persian = [c for c in _els(browser, "article.rq") if c.get_attribute("data-chapter") == "dns"]
    assert len(persian) == 2
    for q in persian:
        _assert_reads(browser, _el(q, ".rq-text"), "fa", "rtl")
        _assert_reads(browser, _el(q, ".rq-expl"), "fa", "rtl")
        choices = _els(q, ".rq-choices li")
        assert len(choices) == 4
        for li in choices:
            _assert_reads(browser, li, "fa", "rtl")
        # The choices' list runs right to left too; the letter keeps its own direction.
        _assert_reads(browser, _el(q, ".rq-choices"), "fa", "rtl")
        assert _el(choices[0], ".letter").get_attribute("dir") == "ltr"
    first = persian[0]
    # The Latin term stays in place, inside the right-to-left text.
    assert _el(first, ".rq-text").text == PERSIAN[0].question
    assert _el(first, "li.correct .letter").text.startswith("✓ ")
    # The edit form's fields too.
    _el(first, ".rq-edit").click()
    for css in (".rq-f-question", ".rq-f-explanation"):
        _assert_reads(browser, _el(first, css), "fa", "rtl")
    _assert_reads(browser, _els(first, ".rq-f-choice")[1], "fa", "rtl")
    _el(first, ".rq-cancel").click()

    english = next(c for c in _els(browser, "article.rq")
                   if c.get_attribute("data-chapter") == "en")
    _assert_reads(browser, _el(english, ".rq-text"), "en", "ltr")
    _assert_reads(browser, _els(english, ".rq-choices li")[0], "en", "ltr")
    _assert_reads(browser, _el(english, ".rq-expl"), "en", "ltr")
    _save_screenshot(browser, dep.workdir / "review-persian.png")

    # The questions table: the question cell and the choices the same way.
    _el(card, ".show-questions").click()
    wait_for(lambda: len(_els(browser, "#q-rows tr")) == 3, 20, "the questions table")
    rows = {r.get_attribute("data-chapter"): r for r in _els(browser, "#q-rows tr")}
    _assert_reads(browser, _el(rows["dns"], "td.q-text"), "fa", "rtl")
    _assert_reads(browser, _els(rows["dns"], "li")[2], "fa", "rtl")
    _assert_reads(browser, _el(rows["en"], "td.q-text"), "en", "ltr")


def _save_screenshot(driver: Any, path: Any) -> None:
    """The Persian chapter's review as a picture, in the test's directory; the syllabus
    reference's docs/img/review-persian.png is replaced only when asked
    (EXAMFORGE_UPDATE_SCREENSHOT=1) or missing."""
    element_shot(driver, _el(driver, '.r-chapter[data-chapter="dns"]'), path, height=1000)
    keep_for_docs(path, SCREENSHOT)
