"""Issue 20's "Done when", end to end with real processes: a chapter pointed at Markdown
course notes, `producer run` with VERIFY=replace against a mock that writes wrong keys (and
solves blind questions truthfully), disputed questions withdrawn and replaced up to the
target, a review through the HTTP API of a real `producer serve` (approve, reject), and
`export --approved-only --format moodle-xml` writing only the approved questions, each with
its Source line and its verdict. Every call the mock billed is a ledger row."""

from __future__ import annotations

import json
import re

import pytest

from apiserver import ApiServer
from harness import assert_stored_exactly_once, dump

pytestmark = pytest.mark.e2e

NOTES = "\n\n".join(
    f"## Topic {i}\n\n" + " ".join(f"fact{i}w{k}" for k in range(150)) + "." for i in (1, 2, 3))


# SQLite only here, as the tour runs it: grounding, the blind solve and the review it relies on
# run on both databases in tests/integration/test_sources_store.py, test_verify.py and
# test_review_workflow_api.py.
@pytest.mark.parametrize("database", ["sqlite"])
def test_course_notes_to_a_reviewed_moodle_bank(deploy, mock, database):
    mock.configure(latency_s=0.02, wrong_key_rate=0.3, solver_error_rate=0.0, seed=3)
    dep = deploy(database, verify="replace", questions_per_call=5, slice_questions=10,
                 llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    path = dep.syllabus("course", {"title": "Networking course", "chapters": [
        {"id": "net", "title": "Networking", "questions": 10, "sources": ["notes/net.md"]},
        {"id": "ops", "title": "Operations", "questions": 5}]})
    (path.parent / "notes").mkdir()
    (path.parent / "notes" / "net.md").write_text(NOTES)

    done = dep.cli_in_process("run", "course", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_stored_exactly_once(dep, "course", {"net": 10, "ops": 5})
    items = {ch: dep.store.chapter_questions("course", ch)[1] for ch in ("net", "ops")}
    bank = {ch: [q for q in qs if q["withdrawn"] is None] for ch, qs in items.items()}
    disputed = [q for qs in items.values() for q in qs if q["withdrawn"] == "disputed"]
    # The wrong keys were caught, withdrawn and replaced: the target is met with agreed keys.
    assert disputed and all(q["verdict"] == "disputed" for q in disputed), dump(items)
    assert all(q["verdict"] == "agreed" for qs in bank.values() for q in qs)
    assert (len(bank["net"]), len(bank["ops"])) == (10, 5)
    assert all(q["source"].startswith("notes/net.md, Topic ") for q in bank["net"])
    # status shows the verdicts without the review page.
    status = json.loads(dep.cli_in_process("status", "course", "--json").stdout)
    assert status["verification"] == {"agreed": 15, "disputed": len(disputed), "pending": 0,
                                      "withdrawn": len(disputed), "unverified": 0
                                      }, status["verification"]
    text = dep.cli_in_process("status", "course").stdout
    assert f"verification: 15 agreed, {len(disputed)} disputed (replaced), 0 pending" in text
    # Paid calls: every call the mock billed is in the ledger, each generation batch solved
    # once, and the solver was shown the cited passage of every grounded question.
    calls = dep.calls("course")
    billed = [u for u in mock.usage() if u["billed"]]
    assert len(billed) == len(calls) and all(c["outcome"] == "used" for c in calls), dump(calls)
    solves = [c for c in calls if c["kind"] == "solve"]
    generated = [c for c in calls if c["kind"] is None]
    assert len(solves) == len(generated)
    stats = mock.stats()
    grounded = sum(1 for q in items["net"])  # every question of net was solved once
    assert stats["solved_questions"] == 15 + len(disputed)
    assert stats["solved_with_passage"] == grounded

    # The review, through the API: approve every question of net but one, which is rejected,
    # and the first two of ops.
    api = ApiServer.start(dep)
    with api.client() as c:
        exam = c.get("/exams/course").json()
        assert exam["verification"] == status["verification"], exam
        page = c.get("/exams/course/questions", params={"limit": 100}).json()["items"]
        assert len(page) == 15 and {q["verdict"] for q in page} == {"agreed"}
        listed = c.get("/exams/course/chapters/net/questions").json()["items"]
        net = [q for q in listed if q["withdrawn"] is None]
        assert [q["verdict"] for q in net] == ["agreed"] * 10
        ops = [q for q in c.get("/exams/course/chapters/ops/questions").json()["items"]
               if q["withdrawn"] is None]
        rejected = net[-1]
        approved = net[:-1] + ops[:2]
        for q in approved:
            r = c.post(f"/exams/course/questions/{q['id']}/approve",
                       headers={"If-Match": f'"{q["version"]}"'})
            assert r.status_code == 200 and r.json()["review"] == "approved", r.text
        r = c.post(f"/exams/course/questions/{rejected['id']}/reject",
                   json={"version": rejected["version"], "note": "ambiguous"})
        assert r.status_code == 200 and r.json()["withdrawn"] == "rejected", r.text
        summary = c.get("/exams/course/review").json()["totals"]
        assert (summary["approved"], summary["rejected"]) == (11, 1), summary

    target = dep.workdir / "approved.xml"
    out = dep.cli_in_process("export", "course", "--approved-only", "--format", "moodle-xml",
                             "-o", str(target))
    assert out.returncode == 0 and "wrote 11 questions" in out.stderr, out.stderr
    xml = target.read_text()
    blocks = xml.split('<question type="multichoice">')[1:]
    assert len(blocks) == 11
    names = re.findall(r"<name><text>([a-z]+-\d{4})</text></name>", xml)
    assert names == [f"net-{q['number']:04d}" for q in net[:-1]] + \
        [f"ops-{q['number']:04d}" for q in ops[:2]]
    for block in blocks:
        feedback = block.split("<generalfeedback")[1].split("</generalfeedback>")[0]
        assert "Verdict: agreed (an independent blind solve chose this key)" in feedback
    for block in blocks[:9]:
        assert "Source: notes/net.md, Topic " in block.split("</generalfeedback>")[0]
    assert rejected["question"][:40] not in xml
    assert not any(q["question"][:40] in xml for q in disputed)
    # Reviewing and exporting cost nothing.
    assert len([u for u in mock.usage() if u["billed"]]) == len(billed)
