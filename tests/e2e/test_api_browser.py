"""The page in a real headless browser (Debian's chromium through its chromedriver), against a
real `python -m producer serve` and the mock model server: issue 11's scenario. A double click
starts one run, a closed tab neither stops nor doubles it, and the reopened page shows it
finished, every question stored once and paid for once."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

from harness import ROOT, assert_stored_exactly_once, dump, used_batches
from helpers import wait_for
from live_api import LiveApi, serve
from screenshots import keep_for_docs

pytestmark = pytest.mark.e2e

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SLUG = "web"
CHAPTERS = [(f"ch-{i}", 10) for i in range(6)]
QUESTIONS_PER_CALL = 5
BUDGET_USD = 5.0
SCREENSHOT = ROOT / "docs" / "page.png"


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless chromium; its performance log records the page's network requests."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        message = f"{', '.join(missing)} not found (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message + ": the browser test must run in CI", pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def _el(root: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return root.find_element(By.CSS_SELECTOR, css)


def _els(root: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return root.find_elements(By.CSS_SELECTOR, css)


def _open_page(driver: Any, api: LiveApi) -> Any:
    """Load the page, give the token when it asks, and return the exam's card."""
    driver.get(api.url + "/")
    wait_for(lambda: _el(driver, "#login").is_displayed() or _el(driver, "#app").is_displayed(),
             20, "the page to ask for the token or show the exams")
    if _el(driver, "#login").is_displayed():
        _el(driver, "#token").send_keys(api.token)
        _el(driver, "#login-go").click()
    def card() -> Any:  # drawn, with its figures (the card comes first, its bar's data after)
        found = (_els(driver, f'[data-exam="{SLUG}"]') or [None])[0]
        bars = _els(found, ".bar") if found is not None else []
        return found if bars and bars[0].get_attribute("data-target") is not None else None

    return wait_for(card, 20, f"the card of exam {SLUG}")


def _progress(card: Any) -> tuple[int, int, str]:
    bar = _el(card, ".bar")
    return (int(bar.get_attribute("data-done")), int(bar.get_attribute("data-target")),
            _el(card, ".state").get_attribute("data-state"))


def _posts(driver: Any, path: str) -> list[dict[str, Any]]:
    """The POST requests to `path` the page sent, from chromium's own network log."""
    sent = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] != "Network.requestWillBeSent":
            continue
        req = msg["params"]["request"]
        if req["method"] == "POST" and req["url"].endswith(path):
            sent.append(req)
    return sent


def _runs(dep: Any) -> list[tuple[int, str]]:
    """The exam's rows in the database's run table: (id, idempotency key)."""
    from sqlalchemy import text

    with dep.store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            text("SELECT id, idempotency_key FROM run WHERE exam = :e ORDER BY id"), {"e": SLUG})]


def _stored(dep: Any) -> int:
    return len(dep.store.questions(SLUG))


@pytest.mark.parametrize("mode", ["celery", "local"])
def test_a_double_click_and_a_closed_tab_make_one_run_paid_once(deploy, mock, browser, mode):
    # Slow calls, two at a time, at first: the run is surely still going when the tab is
    # closed (12 calls take 9 s); then fast ones, so the test does not wait for nothing.
    mock.configure(latency_s=1.5)
    dep = deploy("sqlite", questions_per_call=QUESTIONS_PER_CALL,
                 llm_price_prompt_per_mtok=2.0, llm_price_completion_per_mtok=6.0)
    if mode == "celery":
        dep.worker(2)
        api = serve(dep)
    else:
        api = serve(dep, "--local", API_LOCAL_CONCURRENCY="2")
    api.put_exam(SLUG, CHAPTERS, title="Browser test")
    total = sum(n for _, n in CHAPTERS)
    needed = sum(math.ceil(n / QUESTIONS_PER_CALL) for _, n in CHAPTERS)
    from selenium.webdriver.common.action_chains import ActionChains

    # 1-2. Open the page, give the token, set a budget, click start twice quickly.
    card = _open_page(browser, api)
    assert _progress(card)[:2] == (0, total)
    _el(card, ".budget-input").send_keys(str(BUDGET_USD))
    start = _el(card, ".start")
    browser.get_log("performance")  # drop what loading the page sent
    ActionChains(browser).click(start).click(start).perform()

    # The bar moves with the stream while the run goes on.
    def part_way() -> bool:
        done, _, run_state = _progress(card)
        return 0 < done < total and run_state == "running"

    wait_for(part_way, 60, "the page to show the run part-way")
    run_id = _el(card, ".run").get_attribute("data-run")
    assert run_id
    posts = _posts(browser, f"/exams/{SLUG}/runs")
    assert len(posts) == 1, dump(posts)  # the second click found the button disabled
    key = posts[0]["headers"].get("Idempotency-Key")
    assert key and json.loads(posts[0]["postData"]) == {"budget_usd": BUDGET_USD}, dump(posts)
    assert _runs(dep) == [(int(run_id), key)]
    assert _el(card, ".start").get_attribute("disabled") is not None

    # 3. Close the tab mid-run; the run goes on without it.
    first = browser.current_window_handle
    browser.switch_to.new_window("window")
    second = browser.current_window_handle
    browser.switch_to.window(first)
    browser.close()
    browser.switch_to.window(second)
    at_close = _stored(dep)
    assert at_close < total
    mock.configure(latency_s=0.05)
    wait_for(lambda: _stored(dep) > at_close, 60, "questions stored after the tab closed")

    # 4. Reopen the page: it finds the same run and shows it finished.
    card = _open_page(browser, api)
    # The card shows the exam's status first and its latest run once that is fetched: both
    # say done, and only the run names its id (a loaded suite read the card in between).
    wait_for(lambda: _progress(card) == (total, total, "done")
             and _el(card, ".run").get_attribute("data-run") == run_id, 120,
             "the reopened page to show the run done")
    with api.client() as c:
        run = c.get(f"/runs/{run_id}").json()
    assert run["state"] == "done" and run["questions"] == {"done": total, "target": total}, run
    assert run["budget_usd"] == BUDGET_USD and 0 < run["cost_usd"] < BUDGET_USD, run
    assert _el(card, ".cost").text == f"${run['cost_usd']:.4f} this run"
    assert _runs(dep) == [(int(run_id), key)]  # one row in the run table: one run, not two

    # Every question stored once, each call paid once: one run, not two.
    assert_stored_exactly_once(dep, SLUG, dict(CHAPTERS))
    billed = [u for u in mock.usage() if u["billed"]]
    assert len(billed) == mock.stats()["calls_total"] == needed, dump(mock.stats())
    assert len(used_batches(dep.calls(SLUG))) == needed

    # The questions table shows every stored question with its correct answer marked.
    _el(card, ".show-questions").click()
    wait_for(lambda: len(_els(browser, "#q-rows tr")) == total, 30, "the questions table")
    answers = {(q["chapter_id"], q["number"]): q for q in dep.store.questions(SLUG)}
    for row in _els(browser, "#q-rows tr"):
        q = answers[(row.get_attribute("data-chapter"), int(row.get_attribute("data-number")))]
        marked = _els(row, "li")
        assert len(marked) == len(q["choices"])
        assert [i for i, li in enumerate(marked) if "correct" in li.get_attribute("class")] == [
            q["answer_index"]]
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    browser.execute_script("window.scrollTo(0, 0)")
    _save_screenshot(browser, dep.workdir / "page.png", mode == "celery")


def _save_screenshot(driver: Any, path: Path, for_readme: bool) -> None:
    """The finished page, in the test's directory; README's picture (docs/page.png) is
    replaced only when asked (EXAMFORGE_UPDATE_SCREENSHOT=1) or missing, so that running the
    tests leaves the work tree clean."""
    assert driver.save_screenshot(str(path))
    if for_readme:
        keep_for_docs(path, SCREENSHOT)


def _a_slow_run_started(deploy: Any, mock: Any, browser: Any) -> tuple[Any, LiveApi, Any, int]:
    """A worker and a server on SQLite, the mock at 1 s a call, the exam's run started from
    the page and its first batch shown: (deployment, server, card, questions in all)."""
    mock.configure(latency_s=1.0)
    dep = deploy("sqlite", questions_per_call=QUESTIONS_PER_CALL)
    dep.worker(2)
    api = serve(dep)
    api.put_exam(SLUG, CHAPTERS, title="Browser test")
    card = _open_page(browser, api)
    _el(card, ".start").click()
    wait_for(lambda: _progress(card)[0] > 0, 60, "the first stored batch on the page")
    return dep, api, card, sum(n for _, n in CHAPTERS)


def _resume_to_the_end(mock: Any, card: Any, total: int, first_run: str) -> str:
    """Click resume with the mock fast again, wait for the new run to finish on the page,
    and return its id (not the cancelled run's)."""
    mock.configure(latency_s=0.05)
    _el(card, ".resume").click()
    wait_for(lambda: _progress(card) == (total, total, "done"), 120,
             "the resumed run to finish on the page")
    second_run = _el(card, ".run").get_attribute("data-run")
    assert second_run != first_run
    return second_run


def test_cancel_then_resume_from_the_page(deploy, mock, browser):
    """Cancel stops the run, resume starts a new run that generates only what is missing:
    two runs. The calls in flight at the cancel are paid for either way, so their replies
    are kept: no call is wasted, and the two runs together pay for the calls needed."""
    dep, api, card, total = _a_slow_run_started(deploy, mock, browser)
    needed = sum(math.ceil(n / QUESTIONS_PER_CALL) for _, n in CHAPTERS)
    assert _el(card, ".resume").get_attribute("disabled") is not None
    _el(card, ".cancel").click()
    wait_for(lambda: _progress(card)[2] == "cancelled", 60, "the page to show the run cancelled")
    first_run = _el(card, ".run").get_attribute("data-run")
    wait_for(lambda: dep.status(SLUG)["usage"]["calls_in_flight"] == 0, 30, "calls to settle")
    assert _stored(dep) < total
    assert _el(card, ".cancel").get_attribute("disabled") is not None

    second_run = _resume_to_the_end(mock, card, total, first_run)
    runs = _runs(dep)
    assert [r[0] for r in runs] == [int(first_run), int(second_run)] and runs[0][1] != runs[1][1]
    with api.client() as c:
        assert c.get(f"/runs/{first_run}").json()["state"] == "cancelled"
    assert_stored_exactly_once(dep, SLUG, dict(CHAPTERS))
    calls = dep.calls(SLUG)
    assert len(used_batches(calls)) == needed
    # A call recorded but not yet sent at the cancel is never sent (failed, at no cost).
    unused = [c for c in calls if c["outcome"] != "used"]
    assert all(c["outcome"] == "failed" and c["cost_usd"] == 0 for c in unused), dump(unused)
    billed = [u for u in mock.usage() if u["billed"]]
    assert len(billed) == len(calls) - len(unused) == needed, dump(mock.stats())


# Holds back the page's reads of one run (GET /runs/ID, not its events or cancel) until
# `window.__releaseRun` is called: a slow answer to a refresh, as a busy server gives one.
_HOLD_RUN_READS = """
const held = String(arguments[0]);
const real = window.fetch.bind(window);
window.__heldReads = 0;
let release;
const gate = new Promise((resolve) => { release = resolve; });
window.__releaseRun = () => release();
window.fetch = async (input, init) => {
  const url = new URL(typeof input === "string" ? input : input.url, location.href);
  const method = (init && init.method) || "GET";
  if (method === "GET" && url.pathname === `/runs/${held}`) {
    window.__heldReads += 1;
    await gate;
  }
  return real(input, init);
};
"""


def test_a_late_refresh_of_the_cancelled_run_never_takes_the_card_back(deploy, mock, browser):
    """Cancel, then resume at once, while the page's refresh of the cancelled run is still
    on its way: when that answer comes, after the new run finished, the card must keep
    showing the new run (before the fix it put the cancelled run back, and with it stopped
    following the new one; CI caught it once)."""
    _, _, card, total = _a_slow_run_started(deploy, mock, browser)
    first_run = _el(card, ".run").get_attribute("data-run")
    browser.execute_script(_HOLD_RUN_READS, first_run)
    _el(card, ".cancel").click()
    wait_for(lambda: _progress(card)[2] == "cancelled", 60, "the page to show the run cancelled")
    wait_for(lambda: browser.execute_script("return window.__heldReads") > 0, 30,
             "the page's refresh of the cancelled run to be held")
    second_run = _resume_to_the_end(mock, card, total, first_run)
    browser.execute_script("window.__releaseRun()")  # the late answer comes now
    wait_for(lambda: browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => "
        f"new URL(e.name).pathname === '/runs/{first_run}').length") > 0, 30,
        "the held read of the cancelled run to complete")
    browser.execute_script("return new Promise((r) => setTimeout(r, 300))")  # let it render
    assert _el(card, ".run").get_attribute("data-run") == second_run
    assert _progress(card) == (total, total, "done")


def test_a_start_whose_reply_is_lost_is_retried_with_its_key_and_makes_one_run(
        deploy, mock, browser):
    """The POST reaches the server (the run is made) and its reply is lost on the way back,
    as a dropped connection loses it: the page retries the same click with the same
    Idempotency-Key and gets that run back, not a second one."""
    dep = deploy("sqlite", questions_per_call=QUESTIONS_PER_CALL)
    api = serve(dep, "--local", API_LOCAL_CONCURRENCY="2")
    api.put_exam(SLUG, CHAPTERS, title="Browser test")
    total = sum(n for _, n in CHAPTERS)
    needed = sum(math.ceil(n / QUESTIONS_PER_CALL) for _, n in CHAPTERS)
    card = _open_page(browser, api)
    # The first start's reply is thrown away after the server answered it.
    browser.execute_script("""
        const real = window.fetch;
        window.__lost = 0;
        window.fetch = async (url, init) => {
          const reply = await real(url, init);
          if (init && init.method === "POST" && String(url).endsWith("/runs")
              && window.__lost === 0) {
            window.__lost = 1;
            throw new TypeError("the connection dropped before the reply");
          }
          return reply;
        };""")
    browser.get_log("performance")  # drop what loading the page sent
    _el(card, ".start").click()
    wait_for(lambda: _progress(card) == (total, total, "done"), 60, "the run to end on the page")
    posts = _posts(browser, f"/exams/{SLUG}/runs")
    keys = [p["headers"].get("Idempotency-Key") for p in posts]
    assert len(posts) == 2 and keys[0] and keys[0] == keys[1], dump(posts)
    assert browser.execute_script("return window.__lost") == 1
    run_id = _el(card, ".run").get_attribute("data-run")
    assert _runs(dep) == [(int(run_id), keys[0])]  # one run in the table, not two
    assert_stored_exactly_once(dep, SLUG, dict(CHAPTERS))
    assert mock.stats()["calls_total"] == needed


def test_the_exam_list_pages_with_more(deploy, browser):
    """25 exams: the page shows the newest 20 and a "more exams" control, which reads the next
    keyset page (GET /exams?after=) and is gone once every exam is shown (issue 19)."""
    from bench.history import build

    dep = deploy("sqlite")
    build(dep.store.engine, 25, 0)
    api = serve(dep, "--local")
    browser.get(api.url + "/")
    wait_for(lambda: _el(browser, "#login").is_displayed(), 20, "the page to ask for a token")
    _el(browser, "#token").send_keys(api.token)
    _el(browser, "#login-go").click()
    wait_for(lambda: len(_els(browser, "[data-exam]")) == 20, 30, "the first 20 exams")
    shown = [c.get_attribute("data-exam") for c in _els(browser, "[data-exam]")]
    assert shown == [f"hist-done-{i:06d}" for i in range(24, 4, -1)]
    more = _el(browser, "#exams-more")
    wait_for(more.is_displayed, 10, "the more control")
    more.click()
    wait_for(lambda: len(_els(browser, "[data-exam]")) == 25, 30, "the last 5 exams")
    assert [c.get_attribute("data-exam") for c in _els(browser, "[data-exam]")][20:] == [
        f"hist-done-{i:06d}" for i in range(4, -1, -1)]
    wait_for(lambda: not more.is_displayed(), 10, "the more control to go")


def test_a_batch_run_from_the_page_shows_its_batch_and_what_it_waits_on(deploy, mock, browser):
    """Batch mode from the page (issue 18): the batch box sends {"batch": true}; while the
    provider's batch runs, the card says what the run waits on and lists the batch with its
    state and counts, instead of a run that looks stuck; then it finishes, paid once."""
    mock.configure(batch_request_s=0.4)
    dep = deploy("sqlite", questions_per_call=QUESTIONS_PER_CALL)
    api = serve(dep, "--local", BATCH_POLL_S="0.3", BATCH_SUBMIT_LEASE_S="20",
                BATCH_HTTP_TIMEOUT_S="5")
    api.put_exam(SLUG, CHAPTERS, title="Browser test")
    total = sum(n for _, n in CHAPTERS)
    needed = sum(math.ceil(n / QUESTIONS_PER_CALL) for _, n in CHAPTERS)
    card = _open_page(browser, api)
    _el(card, ".batch-input").click()
    browser.get_log("performance")
    _el(card, ".start").click()

    def waiting() -> bool:
        detail = _el(card, ".detail")
        rows = _els(card, ".batches tbody tr")
        return (detail.is_displayed() and "waiting on the provider's batch" in detail.text
                and "in_progress" in detail.text and bool(rows)
                and rows[0].get_attribute("data-status") == "in_progress")

    wait_for(waiting, 60, "the card to show the run waiting on an in-progress batch")
    assert _progress(card)[2] == "running"
    [post] = _posts(browser, f"/exams/{SLUG}/runs")
    assert json.loads(post["postData"]) == {"batch": True}
    row = _els(card, ".batches tbody tr")[0]
    assert row.get_attribute("data-batch").startswith("batch_")
    assert f"/{needed} done" in row.text
    mock.configure(batch_request_s=0.01)
    wait_for(lambda: _progress(card) == (total, total, "done"), 120,
             "the page to show the batch run done")
    # Its questions are stored by the poll that saw the batch completed: the card's last
    # read of the run shows it so.
    wait_for(lambda: _els(card, ".batches tbody tr")[0].get_attribute("data-status")
             == "completed", 30, "the batch shown completed")
    assert not _el(card, ".detail").is_displayed()
    assert_stored_exactly_once(dep, SLUG, dict(CHAPTERS))
    paid = [u for u in mock.usage() if u.get("batch") and u["billed"]]
    assert len(paid) == needed and not [u for u in mock.usage() if not u.get("batch")]
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
