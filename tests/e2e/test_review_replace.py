"""Review before export, end to end with a real worker, the CLI and the mock: questions a
reviewer rejects are replaced by the next `enqueue`, only their numbers, each generated once
and paid once; `review` counts them and `export --approved-only` writes only the approved
ones (the SQLite fast path and the store's path on PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from harness import assert_stored_exactly_once, dump
from helpers import wait_for

pytestmark = pytest.mark.e2e

CHAPTERS = [("a", 20), ("b", 10)]
QUESTIONS_PER_CALL = 5


def _paid(mock) -> int:
    return sum(1 for u in mock.usage() if u["billed"])


def _by_number(dep, chapter):
    return {q["number"]: q for q in dep.store.chapter_questions("ex", chapter)[1]
            if q["withdrawn"] is None}


# PostgreSQL only here: review, rejection and what a regeneration keeps run on both databases
# in tests/integration/test_review_store.py, test_reviewed_work_kept.py and
# test_reject_during_run.py; the verify-replace test below is on SQLite.
@pytest.mark.parametrize("database", ["postgres"])
def test_rejected_questions_are_replaced_once_by_the_next_enqueue(deploy, mock, database):
    mock.configure(latency_s=0.05)
    dep = deploy(database, questions_per_call=QUESTIONS_PER_CALL, slice_questions=10)
    dep.syllabus("ex", CHAPTERS)
    dep.worker(4)
    assert dep.cli_in_process("enqueue", "ex").returncode == 0
    report = dep.wait_done("ex", 90)
    assert report["chapters"]["done"] == 2, dump(report)
    first_paid = _paid(mock)
    assert first_paid == 6  # 30 questions, 5 a call

    a, b = _by_number(dep, "a"), _by_number(dep, "b")
    # Reject numbers 2 and 7 (a's first slice), 15 (its second) and b's 3: three slices
    # reopened, four numbers missing. Approve and edit others: they stay as they are.
    rejected = [a[2], a[7], a[15], b[3]]
    for q in rejected:
        dep.store.reject("ex", q["id"], q["version"], "e2e-reviewer", note="wrong")
    approved = [a[1], a[3], b[1]]
    for q in approved:
        dep.store.approve("ex", q["id"], q["version"], "e2e-reviewer")
    dep.store.edit("ex", a[4]["id"], 1, "e2e-reviewer", {"explanation": "Edited by a person."})
    counts = json.loads(dep.cli_in_process("review", "ex", "--json").stdout)
    by = {c["chapter_id"]: c for c in counts["chapters"]}
    assert (by["a"]["questions"], by["a"]["rejected"], by["a"]["approved"],
            by["a"]["unreviewed"]) == (17, 3, 2, 15)
    assert (by["b"]["questions"], by["b"]["rejected"], by["b"]["unreviewed"]) == (9, 1, 8)
    assert counts["totals"]["disputed"] == 0
    assert _paid(mock) == first_paid  # rejecting costs nothing

    # The next enqueue generates exactly the four missing numbers: one call per reopened
    # slice, each asking for what its range lacks, paid once.
    enq = dep.cli_in_process("enqueue", "ex")
    assert enq.returncode == 0, enq.stderr
    report = dep.wait_done("ex", 90)
    assert report["chapters"]["done"] == 2, dump(report)
    wait_for(lambda: report["usage"]["calls_in_flight"] == 0, 5, "no call in flight")
    assert _paid(mock) - first_paid == 3, dump(mock.usage()[-4:])
    calls = dep.calls("ex")
    new_calls = [c for c in calls if c["id"] > max(c["id"] for c in calls[:first_paid])]
    assert sorted((c["chapter_id"], c["requested"], c["questions_stored"], c["outcome"])
                  for c in new_calls) == [("a", 1, 1, "used"), ("a", 2, 2, "used"),
                                          ("b", 1, 1, "used")]
    assert_stored_exactly_once(dep, "ex", dict(CHAPTERS))
    a2, b2 = _by_number(dep, "a"), _by_number(dep, "b")
    for n in (2, 7, 15):
        assert a2[n]["id"] not in {q["id"] for q in rejected} and a2[n]["review"] == "unreviewed"
    assert b2[3]["id"] != b[3]["id"]
    for n in (1, 3):
        assert a2[n]["id"] == a[n]["id"] and a2[n]["review"] == "approved"
    assert a2[4]["explanation"] == "Edited by a person."
    # The rejected rows are kept, out of the numbering, with the numbers they had.
    gone = sorted((q["chapter_id"], q["number"]) for ch in ("a", "b")
                  for q in dep.store.chapter_questions("ex", ch)[1] if q["withdrawn"])
    assert gone == [("a", 2), ("a", 7), ("a", 15), ("b", 3)]

    # A third enqueue has nothing to do and pays nothing.
    assert dep.cli_in_process("enqueue", "ex").returncode == 0
    assert dep.wait_done("ex", 30)["questions"]["done"] == 30
    assert _paid(mock) - first_paid == 3

    # export writes the 30 in the bank (edited text included), --approved-only the three.
    out = dep.workdir / "all.jsonl"
    assert dep.cli_in_process("export", "ex", "-o", str(out)).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 30 and "Edited by a person." in {r["explanation"] for r in rows}
    assert not {q["question"] for q in rejected} & {r["question"] for r in rows}
    for fmt, suffix in (("jsonl", "jsonl"), ("csv", "csv")):
        path = dep.workdir / f"approved.{suffix}"
        done = dep.cli_in_process("export", "ex", "--approved-only", "--format", fmt, "-o",
                                  str(path))
        assert done.returncode == 0 and "wrote 3 questions" in done.stderr, done.stderr
    rows = [json.loads(line) for line in (dep.workdir / "approved.jsonl").read_text().splitlines()]
    assert [(r["chapter_id"], r["number"]) for r in rows] == [("a", 1), ("a", 3), ("b", 1)]
    xml = dep.workdir / "approved.xml"
    assert dep.cli_in_process("export", "ex", "--approved-only", "--format", "moodle-xml",
                              "-o", str(xml)).returncode == 0
    assert xml.read_text().count('<question type="multichoice"') == 3
    table = dep.cli_in_process("review", "ex")
    assert table.returncode == 0 and "to review" in table.stdout, table.stdout


def test_verify_replace_then_review_then_export_approved(deploy, mock):
    """The issue's workflow on the CLI: `run` with VERIFY=replace against a mock that writes
    wrong keys, `review` counts the disputed questions (withdrawn, listed for the record and
    not approvable), a reviewer approves the bank and rejects one, the next `run` replaces
    it, and `export --approved-only` writes the approved questions to Moodle XML."""
    from examforge.errors import Conflict

    mock.configure(latency_s=0.02, wrong_key_rate=0.3, seed=11)
    dep = deploy("sqlite", verify="replace", questions_per_call=QUESTIONS_PER_CALL)
    dep.syllabus("ex", [("a", 10)])
    done = dep.cli_in_process("run", "ex", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = json.loads(dep.cli_in_process("review", "ex", "--json").stdout)["chapters"][0]
    items = dep.store.chapter_questions("ex", "a")[1]
    bank = [q for q in items if q["withdrawn"] is None]
    disputed = [q for q in items if q["withdrawn"] == "disputed"]
    assert len(bank) == 10 and disputed, dump(items)  # the mock's wrong keys were caught
    assert all(q["verdict"] == "agreed" for q in bank)
    assert all(q["verdict"] == "disputed" for q in disputed)
    assert (counts["questions"], counts["disputed"], counts["unreviewed"]) == (
        10, len(disputed), 10)
    with pytest.raises(Conflict, match="withdrawn"):
        dep.store.approve("ex", disputed[0]["id"], 1, "e2e-reviewer")

    for q in bank[:-1]:
        dep.store.approve("ex", q["id"], 1, "e2e-reviewer")
    dep.store.reject("ex", bank[-1]["id"], 1, "e2e-reviewer")
    generated = [c for c in dep.calls("ex") if c["kind"] is None]
    done = dep.cli_in_process("run", "ex", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_stored_exactly_once(dep, "ex", {"a": 10})
    new = [c for c in dep.calls("ex") if c["kind"] is None and c["id"] > generated[-1]["id"]]
    # Only the rejected number is asked for (again only if its replacement was disputed).
    assert new and all(c["requested"] == 1 for c in new), dump(new)
    replacement = [q for q in dep.store.chapter_questions("ex", "a")[1]
                   if q["withdrawn"] is None and q["number"] == bank[-1]["number"]]
    assert replacement[0]["id"] != bank[-1]["id"] and replacement[0]["verdict"] == "agreed"

    xml = dep.workdir / "approved.xml"
    out = dep.cli_in_process("export", "ex", "--approved-only", "--format", "moodle-xml",
                             "-o", str(xml))
    assert out.returncode == 0 and "wrote 9 questions" in out.stderr, out.stderr
    assert xml.read_text().count('<question type="multichoice"') == 9
