"""Issue 27: nothing a reviewer did is lost, on SQLite and PostgreSQL (`store` runs both).

- defect 1: `--regenerate CHAPTER` keeps the approved and edited questions (marked stale,
  with the change named) and the rejected ones (out of the bank), deletes the rest, and
  generates exactly the numbers left free; `discard_reviewed` deletes them all; the dry
  run's preview is what the real command does.
- defect 6: an edit into another question's text is refused (409, naming it), exactly or
  nearly; an accepted edit updates the hash and the near-duplicate signature.
- defect 5: an edit of the key voids the verdict: `pending` again, solved again, and no
  export shows "agreed" for it.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, update

from examforge.errors import DuplicateEdit
from examforge.output import Question, text_hash
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage.base import QE, Q, S
from storage.models import QuestionSig

QS = QuestionSig.__table__  # type: ignore[attr-defined]

TEXTS = ["Which protocol resolves host names to IP addresses?",
         "What does a subnet mask separate in an IPv4 address?",
         "Which layer of the OSI model routes packets between networks?",
         "What is the purpose of the TTL field of an IP packet?",
         "Which port does HTTPS listen on by default?",
         "What does ARP map to a MAC address?"]


def _syllabus(tmp_path, title="Chapter a", questions=6):
    path = write_syllabus(tmp_path / "exams", "ex", {"title": "Ex", "chapters": [
        {"id": "a", "title": title, "questions": questions}]})
    return load_syllabus(path, max_questions=1000)


@pytest.fixture
def exam(store, tmp_path):
    store.sync_exam("ex", _syllabus(tmp_path))
    store.import_questions("ex", {"a": [
        Question(t, (f"w{i}", f"x{i}", f"y{i}", f"z{i}"), 1, f"because {i}")
        for i, t in enumerate(TEXTS)]}, "test")
    return store


def _items(store):
    return {q["number"]: q for q in store.chapter_questions("ex", "a")[1]}


def _review(store):
    """#1 approved, #2 edited, #3 edited then approved, #4 rejected; #5 and #6 untouched."""
    q = _items(store)
    store.approve("ex", q[1]["id"], 1, "alice")
    store.edit("ex", q[2]["id"], 1, "alice", {"explanation": "a better reason"})
    store.edit("ex", q[3]["id"], 1, "alice", {"explanation": "another reason"})
    store.approve("ex", q[3]["id"], 2, "alice")
    store.reject("ex", q[4]["id"], 1, "alice")
    return q


def test_regenerate_keeps_approved_edited_and_rejected_questions(exam, tmp_path):
    before = _review(exam)
    changed = _syllabus(tmp_path, title="Chapter a, revised")
    preview = exam.regeneration_preview("ex", changed, ["a"])["a"]
    plan = exam.sync_exam("ex", changed, regenerate=["a"])
    done = plan.regenerated["a"]
    # The dry run says exactly what the command then does, and prints the same lines.
    assert preview.as_dict() == done.as_dict() and preview.lines("ex") == done.lines("ex")
    assert done.keeps == {"approved": [1], "edited": [2, 3], "rejected": [4]}
    assert done.deletes == {"unreviewed": [5, 6]}
    assert done.generates == [4, 5, 6]
    assert done.lines("ex") == [
        "regenerate ex/a: its title or prompt changed",
        "  keeps:     1 approved (1), 2 edited (2-3), 1 rejected (4)",
        "  deletes:   2 unreviewed (5-6)",
        "  generates: 3 (4-6)"]
    assert plan.slices == [("a", 0)]  # its missing numbers are enqueued

    items = _items(exam)
    for number in (1, 2, 3):
        q = items[number]
        assert q["id"] == before[number]["id"] and q["review"] == "stale"
        assert q["stale"] == "its title or prompt changed"
    assert items[2]["explanation"] == "a better reason"
    rejected = [q for q in exam.chapter_questions("ex", "a")[1] if q["withdrawn"]]
    assert [(q["id"], q["number"]) for q in rejected] == [(before[4]["id"], 4)]
    # Nothing of the history is lost: the mark is one more row of it.
    history = exam.question_history("ex", before[3]["id"])
    assert [h["action"] for h in history] == ["edit", "approve", "stale"]
    assert history[-1]["changes"] == {"review": ["approved", "stale"]}
    with exam.engine.connect() as conn:
        kept = set(conn.execute(select(QS.c.question_id)).scalars())
        assert {before[n]["id"] for n in (1, 2, 3, 4)} <= kept
        assert not kept & {before[n]["id"] for n in (5, 6)}
    # review counts them; approving one again clears the mark.
    summary = exam.review_summary("ex")[0]
    assert (summary.stale, summary.approved, summary.questions) == (3, 0, 3)
    again = exam.approve("ex", before[1]["id"], items[1]["version"], "alice")
    assert (again["review"], again["stale"]) == ("approved", None)
    # --approved-only never writes a stale question: only the one approved again.
    assert [q["question"] for q in exam.iter_questions("ex", approved_only=True)] == [
        TEXTS[0]]


def test_regenerate_discard_reviewed_deletes_everything(exam, tmp_path):
    _review(exam)
    plan = exam.sync_exam("ex", _syllabus(tmp_path), regenerate=["a"], discard_reviewed=True)
    done = plan.regenerated["a"]
    assert done.keeps == {}
    assert done.deletes == {"unreviewed": [5, 6], "approved": [1], "edited": [2, 3],
                            "rejected": [4]}
    assert done.generates == [1, 2, 3, 4, 5, 6]
    assert done.change == "regenerated with no change to its title, prompt or sources"
    assert exam.chapter_questions("ex", "a")[1] == []
    with exam.engine.connect() as conn:
        assert conn.execute(select(QE.c.id).where(QE.c.chapter_id == "a")).all() == []


def test_an_edit_into_another_questions_text_is_refused(exam):
    q = _items(exam)
    with pytest.raises(DuplicateEdit) as caught:
        exam.edit("ex", q[5]["id"], 1, "bob", {"question": "  which PROTOCOL resolves host "
                                                             "names to IP addresses? "})
    assert caught.value.other_id == q[1]["id"] and caught.value.other_number == 1
    assert f"question {q[1]['id']}" in str(caught.value)
    # A near-duplicate (reworded) is refused the same way.
    with pytest.raises(DuplicateEdit) as near:
        exam.edit("ex", q[5]["id"], 1, "bob",
                  {"question": "Which protocol resolves the host names into IP addresses?"})
    assert near.value.other_id == q[1]["id"]
    assert _items(exam)[5]["version"] == 1  # nothing changed
    assert len(list(exam.iter_questions("ex"))) == 6


def test_an_accepted_edit_updates_the_hash_and_the_signature(exam):
    q = _items(exam)
    new = "Which command shows the route a packet takes to a host?"
    exam.edit("ex", q[5]["id"], 1, "bob", {"question": new})
    with exam.engine.connect() as conn:
        assert conn.execute(select(Q.c.norm_hash).where(Q.c.id == q[5]["id"])
                            ).scalar_one() == text_hash(new)
    # The old text is free again; the new one is taken, exactly and nearly.
    exam.edit("ex", q[6]["id"], 1, "bob", {"question": TEXTS[4]})
    with pytest.raises(DuplicateEdit):
        exam.edit("ex", q[1]["id"], 1, "bob",
                  {"question": "Which command shows the route that a packet takes to hosts?"})


def test_an_edited_key_voids_the_verdict(exam):
    q = _items(exam)
    with exam.engine.begin() as conn:  # as a blind solve booked them: agreed
        conn.execute(update(Q).where(Q.c.exam == "ex").values(verdict="agreed",
                                                              solved_index=1))
        conn.execute(update(S).where(S.c.exam == "ex").values(state="done"))
    moved = exam.edit("ex", q[2]["id"], 1, "bob", {"answer_index": 2})
    assert (moved["verdict"], moved["solved_index"], moved["answer_index"]) == (
        "pending", None, 2)
    history = exam.question_history("ex", q[2]["id"])
    assert history[-1]["changes"]["verdict"] == ["agreed", "pending"]
    # The export says pending, never "agreed" for a key the solver never saw.
    exported = {e["number"]: e for e in exam.iter_questions("ex")}
    assert exported[2]["verdict"] == "pending" and exported[1]["verdict"] == "agreed"
    # Its slice is pending again: the question is solved again by the next run.
    with exam.engine.connect() as conn:
        assert conn.execute(select(S.c.state).where(S.c.exam == "ex")).scalar_one() == "pending"
    # An edit of the explanation alone keeps the verdict.
    kept = exam.edit("ex", q[1]["id"], 1, "bob", {"explanation": "clearer"})
    assert (kept["verdict"], kept["solved_index"]) == ("agreed", 1)
    assert json.loads(json.dumps(kept))["stale"] is None


def test_status_and_review_count_the_unverified_questions_of_a_verified_exam(exam):
    """The review tells the whole truth: 5 verdicts for 6 questions is not "verified"."""
    from producer.printing import verdicts_text as _verdicts

    q = _items(exam)
    assert exam.status("ex").verification is None  # never verified: nothing to count
    assert exam.review_summary("ex")[0].unverified is None
    with exam.engine.begin() as conn:
        conn.execute(update(Q).where(Q.c.exam == "ex", Q.c.id != q[6]["id"]).values(
            verdict="agreed", solved_index=1))
        conn.execute(update(Q).where(Q.c.id == q[5]["id"]).values(verdict="pending",
                                                                  solved_index=None))
    v = exam.status("ex").verification
    assert (v.agreed, v.pending, v.unverified) == (4, 1, 1)
    assert _verdicts(v) == "4 agreed, 0 disputed, 1 pending, 1 unverified"
    assert exam.status("ex").as_dict()["verification"]["unverified"] == 1
    assert exam.review_summary("ex")[0].unverified == 2  # no verdict booked: pending or none
    items = _items(exam)
    assert (items[1]["solved_index"], items[5]["solved_index"], items[6]["solved_index"]) == (
        1, None, None)


def test_a_kept_question_past_a_lowered_target_moves_into_the_range(exam, tmp_path):
    q = _items(exam)
    exam.approve("ex", q[6]["id"], 1, "alice")
    done = exam.sync_exam("ex", _syllabus(tmp_path, questions=3), regenerate=["a"]
                          ).regenerated["a"]
    assert done.keeps == {"approved": [6]} and done.generates == [2, 3]
    items = _items(exam)
    assert items[1]["id"] == q[6]["id"] and items[1]["review"] == "stale"


def test_migration_0027_adds_the_stale_column_and_back(exam):
    from alembic import command
    from sqlalchemy import inspect

    from storage import migrate
    from storage.db import alembic_config

    engine = exam.engine
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0026")
    assert "stale" not in {c["name"] for c in inspect(engine).get_columns("question")}
    migrate(engine)
    assert {q["stale"] for q in exam.chapter_questions("ex", "a")[1]} == {None}


def test_a_changed_source_is_named_on_the_questions_it_leaves_stale(store):
    from examforge.sources import ChapterMaterial, read_material
    from examforge.syllabus import Syllabus

    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 3, "sources": ["notes/n.md"]}]})

    def material(text: str) -> dict[str, ChapterMaterial]:
        return {"a": read_material(["notes/n.md"], lambda name: text.encode(), str)}

    store.sync_exam("ex", syllabus, material=material("# One\n\nFirst version of the notes."))
    store.import_questions("ex", {"a": [
        Question(t, ("w", "x", "y", "z"), 0, "why") for t in TEXTS[:3]]}, "test")
    first = _items(store)[1]
    store.approve("ex", first["id"], 1, "alice")
    changed = material("# One\n\nSecond version of the notes.")
    done = store.sync_exam("ex", syllabus, ["a"], material=changed).regenerated["a"]
    assert done.change == "source notes/n.md differs (its file's hash changed)"
    kept = _items(store)[1]
    assert (kept["id"], kept["review"], kept["stale"]) == (first["id"], "stale", done.change)


@pytest.mark.parametrize("scope", ["off", "exam"])
def test_an_edit_through_the_api_follows_near_dup_scope(make_settings, db_url, scope):
    """NEAR_DUP_SCOPE=off: exact repeats are still refused (409 naming the question), a
    reworded one is stored; exam: a near-duplicate in another chapter is refused too."""
    from api_support import api

    from storage import open_store

    store = open_store(db_url)
    store.sync_exam("ex", load_syllabus(write_syllabus(
        make_settings().exams_dir, "ex", [("a", 2), ("b", 1)]), max_questions=1000))
    store.import_questions("ex", {
        "a": [Question(t, ("w", "x", "y", "z"), 0, "why") for t in TEXTS[:2]],
        "b": [Question(TEXTS[2], ("w", "x", "y", "z"), 0, "why")]}, "test")
    a1, a2 = store.chapter_questions("ex", "a")[1]
    store.engine.dispose()
    with api(make_settings, database_url=db_url, near_dup_scope=scope) as client:
        exact = client.patch(f"/exams/ex/questions/{a2['id']}",
                             json={"version": 1, "question": TEXTS[0].upper()})
        assert exact.status_code == 409, exact.text
        assert exact.json()["duplicate_of"] == {"id": a1["id"], "number": 1}
        reworded = "Which layer of the OSI model routes the packets between two networks?"
        near = client.patch(f"/exams/ex/questions/{a2['id']}",
                            json={"version": 1, "question": reworded})
        assert near.status_code == (200 if scope == "off" else 409), near.text
