"""The review view of the page in a real headless browser (Debian's chromium through its
chromedriver) against a real `python -m producer serve --local` and the mock: a reviewer
approves, edits and rejects questions, and a save made from a version another reviewer has
changed since is refused (409) and shown, with nothing overwritten; the solver's choice is
shown beside the key, a rejected question moves under the chapter's withdrawn heading with
no action button, and after its chapter is regenerated the approved and edited questions
show as stale with the change named (issue 27). The database is checked after each step;
the view's picture is README's docs/review.png."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from harness import ROOT
from helpers import wait_for
from live_api import TOKEN, serve
from screenshots import element_shot, keep_for_docs
from producer.api.runs import client_of
from test_api_browser import _el, _els, browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

SLUG = "rev"
CHAPTERS = [("ch-1", 4), ("ch-2", 2)]
OTHER = "tok-second-reviewer"
SCREENSHOT = ROOT / "docs" / "review.png"


def _row(driver: Any, qid: int) -> Any:
    return _el(driver, f'article.rq[data-id="{qid}"]')


def _attr(driver: Any, qid: int, name: str) -> str:
    return _row(driver, qid).get_attribute(f"data-{name}")


def test_a_review_in_the_page(deploy, mock, browser):  # noqa: F811
    mock.configure(latency_s=0.02)
    dep = deploy("sqlite", questions_per_call=4)
    api = serve(dep, "--local", API_TOKENS=f"{TOKEN},{OTHER}")
    with api.client() as c:
        assert c.put(f"/exams/{SLUG}", json={"title": "Operations basics", "chapters": [
            {"id": cid, "title": f"Chapter {cid}", "questions": n,
             "difficulty": {"easy": 0.5, "hard": 0.5}, "bloom": ["understand", "apply"]}
            for cid, n in CHAPTERS]}).status_code == 201
        run = c.post(f"/exams/{SLUG}/runs", json={}, headers={"Idempotency-Key": "r1"}).json()
        wait_for(lambda: c.get(f"/runs/{run['id']}").json()["state"] == "done", 60,
                 "the run to finish")
    store = dep.store
    questions = {ch: store.chapter_questions(SLUG, ch)[1] for ch, _ in CHAPTERS}
    first, second, third, fourth = questions["ch-1"]
    # The blind solve's verdicts (VERIFY, which this exam did not run), written as it writes
    # them, so that the view shows both kinds.
    from sqlalchemy import update

    from storage.base import Q

    with store.engine.begin() as conn:
        conn.execute(update(Q).where(Q.c.exam == SLUG).values(verdict="agreed",
                                                              solved_index=Q.c.answer_index))
        conn.execute(update(Q).where(Q.c.id == third["id"]).values(
            verdict="disputed", solved_index=(third["answer_index"] + 1) % 4))
    me, other = client_of(f"Bearer {TOKEN}", True), client_of(f"Bearer {OTHER}", True)

    # Open the page, give the token, open the exam's review.
    browser.get(api.url + "/")
    wait_for(lambda: _el(browser, "#login").is_displayed(), 20, "the token form")
    _el(browser, "#token").send_keys(TOKEN)
    _el(browser, "#login-go").click()
    card = wait_for(lambda: (_els(browser, f'[data-exam="{SLUG}"]') or [None])[0], 20,
                    "the exam's card")
    _el(card, ".show-review").click()
    wait_for(lambda: len(_els(browser, "article.rq")) == 6, 20, "the review's questions")
    totals = _el(browser, "#r-totals").text
    assert "6 to review" in totals and "1 disputed" in totals, totals
    row = _row(browser, first["id"])
    assert _el(row, ".rq-text").text == first["question"]
    assert _el(row, ".rq-verdict").text == "solve: agreed"
    assert _el(_row(browser, third["id"]), ".rq-verdict").text == "solve: disputed"
    # The solver's choice beside the key (issue 27: the review tells the whole truth).
    letter = "ABCD"
    assert _el(_row(browser, third["id"]), ".rq-solved").text == (
        f"solver chose {letter[(third['answer_index'] + 1) % 4]}, "
        f"key {letter[third['answer_index']]}")
    assert _el(row, ".rq-solved").text == (
        f"solver chose {letter[first['answer_index']]}, key {letter[first['answer_index']]}")
    assert _el(row, ".rq-levels").text == f"{first['difficulty']} · {first['bloom']}"
    assert first["difficulty"] in ("easy", "hard") and first["bloom"] in ("understand", "apply")
    assert _el(row, "li.correct").text.endswith(first["choices"][first["answer_index"]])

    # Approve.
    _el(_row(browser, first["id"]), ".rq-approve").click()
    wait_for(lambda: _attr(browser, first["id"], "review") == "approved", 10, "approved")
    assert _attr(browser, first["id"], "version") == "2"
    now = store.review_question(SLUG, first["id"])
    assert (now["review"], now["version"], now["reviewed_by"]) == ("approved", 2, me)

    # Edit: the new text is stored, the history keeps the old one and who changed it.
    row = _row(browser, second["id"])
    _el(row, ".rq-edit").click()
    box = _el(row, ".rq-f-question")
    box.clear()
    box.send_keys("Which device forwards packets between networks?")
    _el(row, ".rq-save").click()
    wait_for(lambda: _el(_row(browser, second["id"]), ".rq-text").text
             == "Which device forwards packets between networks?", 10, "the edit shown")
    assert not _el(_row(browser, second["id"]), ".rq-form").is_displayed()
    now = store.review_question(SLUG, second["id"])
    assert now["question"] == "Which device forwards packets between networks?"
    edit = store.question_history(SLUG, second["id"])[-1]
    assert edit["client"] == me and edit["changes"]["question"] == [
        second["question"], "Which device forwards packets between networks?"]

    # Reject: it leaves the bank (withdrawn), shown as rejected with its buttons off.
    _el(_row(browser, third["id"]), ".rq-reject").click()
    wait_for(lambda: _attr(browser, third["id"], "review") == "rejected", 10, "rejected")
    assert _attr(browser, third["id"], "withdrawn") == "rejected"
    assert _el(_row(browser, third["id"]), ".rq-approve").get_attribute("disabled") is not None
    assert store.review_question(SLUG, third["id"])["withdrawn"] == "rejected"
    # Under the chapter's withdrawn heading, by the number it had, with no action button.
    withdrawn = _el(browser, '.r-chapter[data-chapter="ch-1"] .r-withdrawn-part')
    assert withdrawn.is_displayed() and "Withdrawn" in withdrawn.text
    assert [_el(r, ".rq-num").text for r in _els(withdrawn, "article.rq")] == ["#3"]
    assert not _el(_row(browser, third["id"]), ".rq-actions").is_displayed()
    wait_for(lambda: "1 rejected" in _el(browser, "#r-totals").text, 10, "the counts")

    # A conflicting save: the page opens the edit at version 1, another reviewer saves the
    # question meanwhile (version 2), and the page's save is refused and shown.
    row = _row(browser, fourth["id"])
    _el(row, ".rq-edit").click()
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {OTHER}"}) as c:
        theirs = c.patch(f"/exams/{SLUG}/questions/{fourth['id']}",
                         json={"explanation": "The other reviewer's explanation."},
                         headers={"If-Match": '"1"'})
        assert theirs.status_code == 200, theirs.text
    box = _el(row, ".rq-f-question")
    box.clear()
    box.send_keys("My conflicting wording?")
    _el(row, ".rq-save").click()
    conflict = wait_for(lambda: (lambda el: el if el.is_displayed() else None)(
        _el(_row(browser, fourth["id"]), ".rq-conflict")), 10, "the conflict shown")
    assert "409" in conflict.text and "version 1" in conflict.text and "version 2" in conflict.text
    row = _row(browser, fourth["id"])
    assert _el(row, ".rq-expl").text == "The other reviewer's explanation."  # theirs, shown
    assert _el(row, ".rq-f-question").get_attribute("value") == "My conflicting wording?"
    # The form now holds the other reviewer's explanation (a field this reviewer left alone).
    assert _el(row, ".rq-f-explanation").get_attribute("value") == \
        "The other reviewer's explanation."
    now = store.review_question(SLUG, fourth["id"])
    assert now["question"] == fourth["question"] and now["version"] == 2  # nothing overwritten
    assert now["explanation"] == "The other reviewer's explanation." and now["reviewed_by"] == other
    # Chromium logs the refused save's response itself; nothing else may be an error.
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"
                and "status of 409" not in e["message"]]

    browser.execute_script("arguments[0].scrollIntoView()", _el(browser, "#review"))
    _save_screenshot(browser, dep.workdir / "review.png")

    # Saved again, knowingly, from the current version: applied over it.
    _el(_row(browser, fourth["id"]), ".rq-save").click()
    wait_for(lambda: _attr(browser, fourth["id"], "version") == "3", 10, "the second save")
    now = store.review_question(SLUG, fourth["id"])
    assert now["question"] == "My conflicting wording?"
    assert now["explanation"] == "The other reviewer's explanation."
    assert [h["client"] for h in store.question_history(SLUG, fourth["id"])] == [other, me]

    # The chapter's title changes and it is regenerated (`enqueue --regenerate ch-1`): the
    # approved and edited questions stay, shown stale with the change named; the rejected
    # one stays under the withdrawn heading; approving a stale one again clears it.
    from examforge.syllabus import parse_syllabus

    changed = parse_syllabus(json.dumps({"title": "Operations basics", "chapters": [
        {"id": cid, "title": f"Chapter {cid}" + (", revised" if cid == "ch-1" else ""),
         "questions": n} for cid, n in CHAPTERS]}).encode(), "syllabus.json",
        max_questions=1000)
    done = store.sync_exam(SLUG, changed, regenerate=["ch-1"]).regenerated["ch-1"]
    assert done.keeps == {"approved": [1], "edited": [2, 4], "rejected": [3]}
    _el(card, ".show-review").click()  # the view is read again: its rows are made anew

    def shown_stale() -> bool:
        rows = _els(browser, f'article.rq[data-id="{first["id"]}"][data-review="stale"]')
        return len(_els(browser, "article.rq")) == 6 and bool(rows)

    wait_for(shown_stale, 20, "the stale view")
    for q in (first, second, fourth):
        row = _row(browser, q["id"])
        assert _el(row, ".rq-state").text == "stale"
        assert "its title or prompt changed" in _el(row, ".rq-stale").text
        assert _el(row, ".rq-approve").is_enabled() and _el(row, ".rq-edit").is_enabled()
    assert "3 stale" in _el(browser, "#r-totals").text
    withdrawn = _el(browser, '.r-chapter[data-chapter="ch-1"] .r-withdrawn-part')
    assert [_el(r, ".rq-num").text for r in _els(withdrawn, "article.rq")] == ["#3"]
    assert not _el(_row(browser, third["id"]), ".rq-actions").is_displayed()
    _el(_row(browser, first["id"]), ".rq-approve").click()
    wait_for(lambda: _attr(browser, first["id"], "review") == "approved", 10, "approved again")
    assert not _el(_row(browser, first["id"]), ".rq-stale").is_displayed()
    now = store.review_question(SLUG, first["id"])
    assert (now["review"], now["stale"]) == ("approved", None)


def _save_screenshot(driver: Any, path: Any) -> None:
    """The review view, for README's docs/review.png (screenshots.py)."""
    element_shot(driver, _el(driver, "#review"), path)
    keep_for_docs(path, SCREENSHOT)
