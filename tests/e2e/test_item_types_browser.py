"""The review of every item type (issue 32) in a real headless browser against a real
`python -m producer serve --local` and the mock: each type shows its key (a multi's correct
choices marked, true or false, the accepted answers, the value and tolerance) and the blind
solver's answer; the edit form shows the type's own fields, a save sends them and the
database has them; an invalid edit is refused (422), shown, and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import wait_for
from live_api import TOKEN, serve
from test_api_browser import _el, _els, browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

SLUG = "mix"
TYPES = {"mcq": 1, "multi": 1, "truefalse": 1, "short": 1, "numeric": 1}


def _row(driver: Any, qid: int) -> Any:
    return _el(driver, f'article.rq[data-id="{qid}"]')


def _fill(element: Any, text: str) -> None:
    element.clear()
    element.send_keys(text)


def test_each_type_is_shown_and_edited_in_the_page(deploy, mock, browser):  # noqa: F811
    mock.configure(latency_s=0.01)
    dep = deploy("sqlite", questions_per_call=5)
    api = serve(dep, "--local")
    with api.client() as c:
        assert c.put(f"/exams/{SLUG}", json={"title": "Mixed", "verify": "flag", "chapters": [
            {"id": "a", "title": "Chapter A", "questions": 5, "types": TYPES}]}
        ).status_code == 201
        run = c.post(f"/exams/{SLUG}/runs", json={}, headers={"Idempotency-Key": "r"}).json()
        wait_for(lambda: c.get(f"/runs/{run['id']}").json()["state"] == "done", 60,
                 "the run to finish")
    store = dep.store
    items = {q["type"]: q for q in store.chapter_questions(SLUG, "a")[1]}
    assert set(items) == set(TYPES)

    browser.get(api.url + "/")
    wait_for(lambda: _el(browser, "#login").is_displayed(), 20, "the token form")
    _el(browser, "#token").send_keys(TOKEN)
    _el(browser, "#login-go").click()
    card = wait_for(lambda: (_els(browser, f'[data-exam="{SLUG}"]') or [None])[0], 20,
                    "the exam's card")
    _el(card, ".show-review").click()
    wait_for(lambda: len(_els(browser, "article.rq")) == 5, 20, "the review's questions")

    multi, tf, short, num = (items[k] for k in ("multi", "truefalse", "short", "numeric"))
    row = _row(browser, multi["id"])
    assert _el(row, ".rq-type").text == "select all"
    marked = [i for i, li in enumerate(_els(row, ".rq-choices li"))
              if "correct" in (li.get_attribute("class") or "")]
    assert marked == multi["correct"]
    assert _el(_row(browser, tf["id"]), ".rq-key").text == (
        f"key: {'true' if tf['answer'] else 'false'}")
    assert _el(_row(browser, short["id"]), ".rq-key").text.startswith(
        f"key: “{short['accepted'][0]}”")
    assert _el(_row(browser, num["id"]), ".rq-key").text.startswith(f"key: {num['value']:g}")
    assert _el(_row(browser, tf["id"]), ".rq-solved").text == (
        f"solver answered {'true' if tf['answer'] else 'false'}")
    assert not _el(_row(browser, tf["id"]), ".rq-choices").find_elements("css selector", "li")

    # Edit a true/false statement's value: the form shows its one field, not choices.
    row = _row(browser, tf["id"])
    _el(row, ".rq-edit").click()
    assert _el(row, ".rq-f-tf").is_displayed()
    assert not _el(row, ".rq-f-choice").is_displayed()
    assert not _el(row, ".rq-f-value").is_displayed()
    select = _el(row, ".rq-f-tf")
    select.find_element("css selector",
                        f'option[value="{"false" if tf["answer"] else "true"}"]').click()
    _el(row, ".rq-save").click()
    wait_for(lambda: store.review_question(SLUG, tf["id"])["answer"] is (not tf["answer"]),
             10, "the edited value stored")
    assert store.review_question(SLUG, tf["id"])["verdict"] == "pending"

    # Edit a number: value, tolerance and unit.
    row = _row(browser, num["id"])
    _el(row, ".rq-edit").click()
    _fill(_el(row, ".rq-f-value"), "42.5")
    _fill(_el(row, ".rq-f-tolerance"), "0.5")
    _fill(_el(row, ".rq-f-unit"), "ms")
    _el(row, ".rq-save").click()
    wait_for(lambda: store.review_question(SLUG, num["id"])["value"] == 42.5, 10,
             "the number stored")
    now = store.review_question(SLUG, num["id"])
    assert (now["tolerance"], now["unit"]) == (0.5, "ms")
    wait_for(lambda: _el(_row(browser, num["id"]), ".rq-key").text.startswith(
        "key: 42.5 ms ± "), 10, "the new key shown")

    # An invalid edit: one correct choice for a multi is refused (422) and shown.
    row = _row(browser, multi["id"])
    _el(row, ".rq-edit").click()
    for box in _els(row, ".rq-f-correct"):
        if box.is_selected() != (box.get_attribute("value") == "0"):
            box.click()
    _el(row, ".rq-save").click()
    wait_for(lambda: _el(_row(browser, multi["id"]), ".rq-conflict").is_displayed(), 10,
             "the refusal shown")
    assert "correct" in _el(_row(browser, multi["id"]), ".rq-conflict").text
    assert store.review_question(SLUG, multi["id"])["correct"] == multi["correct"]
    assert store.review_question(SLUG, multi["id"])["version"] == multi["version"]
