"""A first call planned before its claim (Leases.fresh_view, both databases) for a slice the
claim then finds otherwise is planned again from what the claim read, with nothing of the
first plan left over: the item types it counted from the view (nothing stored) and the course
material it sized (none) are the slice's, as the claim read them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
from sqlalchemy import text

from examforge.llm import LLMClient
from examforge.sources import read_material
from examforge.syllabus import Syllabus
from mockllm import MockConfig, MockServer
from runner.pipeline import Runtime, process_chapter

TYPES = {"mcq": 2, "truefalse": 2, "numeric": 2}


def _run(store: Any, settings: Any, slices: list[tuple[str, int]],
         transport: httpx.BaseTransport | None = None) -> None:
    rt = Runtime.build(settings, store, LLMClient(settings, transport=transport))
    try:
        for chapter_id, slice_no in slices:
            assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
    finally:
        rt.keeper.stop()
        rt.client.close()


def test_a_rejected_items_replacement_is_of_its_type_when_planned_before_the_claim(
        store: Any, make_settings: Any, db_url: str) -> None:
    syllabus = Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": 6, "types": TYPES}]})
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=6, slice_questions=50)
        plan = store.sync_exam("ex", syllabus, slice_questions=50)
        _run(store, settings, plan.slices)
        with store.engine.connect() as conn:
            tf_id = conn.execute(text("SELECT id FROM question WHERE type = 'truefalse' "
                                      "ORDER BY number LIMIT 1")).scalar_one()
        store.reject("ex", tf_id, 1, "test")
        store.sync_exam("ex", syllabus, slice_questions=50)
        # The worker knows the slice as open: its next call is planned before the claim,
        # from a view with nothing stored (six of every type lacking).
        assert store.fresh_view("ex", "a", 0) is not None
        _run(store, settings, [("a", 0)])
    with store.engine.connect() as conn:
        types = conn.execute(text("SELECT type FROM question WHERE number IS NOT NULL"
                                  )).scalars().all()
    assert Counter(types) == TYPES


class _Recording(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read().decode())
        return super().handle_request(request)


def test_material_added_after_the_view_was_read_is_in_the_first_prompt(
        store: Any, make_settings: Any, db_url: str) -> None:
    chapters: list[dict[str, Any]] = [{"id": "a", "title": "A", "questions": 4}]
    store.sync_exam("ex", Syllabus.model_validate({"title": "T", "chapters": chapters}),
                    slice_questions=50)
    assert store.fresh_view("ex", "a", 0) is not None  # read without material
    notes = "# One\n\n" + " ".join(f"walrus{k}" for k in range(200))
    chapters[0]["sources"] = ["n.md"]
    plan = store.sync_exam(
        "ex", Syllabus.model_validate({"title": "T", "chapters": chapters}),
        slice_questions=50,
        material={"a": read_material(["n.md"], lambda name: notes.encode(), str)})
    assert plan.slices == [("a", 0)]
    recording = _Recording()
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=4, slice_questions=50)
        _run(store, settings, plan.slices, transport=recording)
    assert recording.bodies and "walrus17" in recording.bodies[0]
