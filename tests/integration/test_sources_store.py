"""Course material on both databases: passages written with a chapter's slices, questions
storing the passage they cite, the share cited in `status`, a changed file held until
--regenerate, uploaded sources kept as bytes, and the migration up and down."""

from __future__ import annotations

from typing import Any

import pytest

from examforge.sources import ChapterMaterial, Passage, read_material
from examforge.syllabus import Syllabus
from mockllm import MockConfig, MockServer
from runner.pipeline import Runtime, process_chapter
from examforge.llm import LLMClient


def _syllabus(questions: int = 8) -> Syllabus:
    return Syllabus.model_validate({"title": "T", "chapters": [
        {"id": "a", "title": "A", "questions": questions, "sources": ["n.md"]},
        {"id": "b", "title": "B", "questions": 2}]})


def _material(text: str) -> dict[str, ChapterMaterial]:
    return {"a": read_material(["n.md"], lambda name: text.encode(), str),
            "b": ChapterMaterial()}


def _notes(n: int) -> str:
    return "\n\n".join(f"# T{i}\n\n" + " ".join(f"w{i}x{k}" for k in range(200)) for i in
                       range(1, n + 1))


def test_passages_citations_coverage_and_a_changed_file(store: Any, make_settings: Any,
                                                        db_url: str) -> None:
    plan = store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(4)))
    assert sorted(plan.slices) == [("a", 0), ("a", 1), ("b", 0)]
    assert [p.where for p in store.chapter_passages("ex", "a")] == ["T1", "T2", "T3", "T4"]
    assert store.passage("ex", "a", 2).reference == "n.md, T2, passage p2"
    assert store.passage("ex", "a", 9) is None
    with MockServer(MockConfig(latency_s=0)) as mock:
        settings = make_settings(database_url=db_url, llm_base_url=mock.base_url,
                                 questions_per_call=4, slice_questions=4)
        rt = Runtime.build(settings, store, LLMClient(settings))
        try:
            for chapter_id, slice_no in plan.slices:
                assert process_chapter(rt, "ex", chapter_id, slice_no).outcome == "done"
        finally:
            rt.keeper.stop()
            rt.client.close()
    rows = [r for r in store.iter_questions("ex") if r["chapter_id"] == "a"]
    # Slice 0 (numbers 1-4) was offered T1-T2, slice 1 (5-8) T3-T4.
    assert {r["source"] for r in rows[:4]} == {"n.md, T1, passage p1", "n.md, T2, passage p2"}
    assert {r["source"] for r in rows[4:]} == {"n.md, T3, passage p3", "n.md, T4, passage p4"}
    coverage = {c.id: c.material for c in store.status("ex").chapter_list}
    assert (coverage["a"].cited, coverage["a"].passages) == (4, 4) and coverage["b"] is None
    # A changed file: reported, the chapter left as it is (passages too).
    plan = store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(5)))
    assert plan.skipped["a"].startswith("changed: source n.md differs") and "a" not in plan.to_enqueue
    assert len(store.chapter_passages("ex", "a")) == 4
    # Unchanged, with a raised target: new slices, no report.
    plan = store.sync_exam("ex", _syllabus(12), slice_questions=4, material=_material(_notes(4)))
    assert plan.to_enqueue == ["a"] and plan.slices == [("a", 2)]
    # --regenerate: questions and passages cut afresh from the new file.
    plan = store.sync_exam("ex", _syllabus(), ["a"], slice_questions=4,
                           material=_material(_notes(5)))
    assert "a" in plan.to_enqueue and len(store.chapter_passages("ex", "a")) == 5
    assert store.passage_coverage("ex")["a"] == (0, 5)


def test_a_chapter_with_no_questions_yet_takes_a_changed_file_without_regenerate(
        store: Any) -> None:
    store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(2)))
    plan = store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(3)))
    assert "a" in plan.to_enqueue and len(store.chapter_passages("ex", "a")) == 3
    # Without material (an import), passages are left as they are.
    store.sync_exam("ex", _syllabus(), slice_questions=4)
    assert len(store.chapter_passages("ex", "a")) == 3


def test_uploaded_sources_are_kept_as_bytes(store: Any) -> None:
    data = bytes(range(256)) * 10
    assert store.put_source("demo", "guide.pdf", data) is True
    assert store.put_source("demo", "guide.pdf", data + b"!") is False
    assert store.source_file("demo", "guide.pdf") == data + b"!"
    assert store.source_file("demo", "other.md") is None
    assert [r["name"] for r in store.source_names("demo")] == ["guide.pdf"]


def test_the_migration_goes_down_and_up(db_url: str) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from storage import connect, migrate
    from storage.db import alembic_config

    engine = connect(db_url)
    migrate(engine)
    with engine.begin() as conn:
        cfg = alembic_config(conn)
        command.downgrade(cfg, "0020")
        names = inspect(conn).get_table_names()
        assert "passage" not in names and "source_file" not in names
        assert "source" not in {c["name"] for c in inspect(conn).get_columns("question")}
        command.upgrade(cfg, "0021")
        assert "sources" in {c["name"] for c in inspect(conn).get_columns("slice")}
    engine.dispose()


def test_a_changed_file_counts_only_the_questions_in_the_bank(store: Any) -> None:
    """Withdrawn questions (rejected, disputed) are history: the message counts the bank's,
    and a chapter whose questions were all withdrawn takes the new file like an empty one."""
    from examforge.output import Question

    store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(2)))
    store.import_questions("ex", {"a": [Question(f"What is {i}?", ("w", "x", "y", "z"), 0, "")
                                        for i in range(3)]}, "test")
    ids = [q["id"] for q in store.chapter_questions("ex", "a")[1]]
    store.withdraw("ex", ids[:1], "rejected")
    plan = store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(3)))
    assert plan.skipped["a"].startswith("changed: source n.md differs") and \
        "the 2 stored questions" in plan.skipped["a"], plan.skipped
    store.withdraw("ex", ids[1:], "disputed")
    plan = store.sync_exam("ex", _syllabus(), slice_questions=4, material=_material(_notes(3)))
    assert "a" not in plan.skipped and len(store.chapter_passages("ex", "a")) == 3


def test_a_source_is_parsed_once_per_content_and_again_when_it_changes(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
    from pdf_samples import text_pdf

    import examforge.pdf_extract as pdf_extract
    from examforge.sources import read_exam_material

    children: list[int] = []
    real = pdf_extract.extract

    def counted(*args: Any, **kwargs: Any) -> Any:
        children.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pdf_extract, "extract", counted)
    files = {"g.pdf": text_pdf(["Page one about routing.", "Page two about switching."])}
    chapters = [("a", ["g.pdf"]), ("b", ["g.pdf#pages=2"])]

    def read() -> dict[str, ChapterMaterial]:
        return read_exam_material(chapters, lambda name: files[name], str, store)

    first = read()
    assert len(children) == 2  # the whole file, and its page 2: two ways of reading it
    again = read()
    assert len(children) == 2 and again == first  # from the store: no child, the same text
    files["g.pdf"] = text_pdf(["Page one, edited.", "Page two about switching."])
    changed = read()
    assert len(children) == 4
    assert "edited" in changed["a"].passages[0].text
    assert changed["b"].passages == first["b"].passages  # its page did not change
