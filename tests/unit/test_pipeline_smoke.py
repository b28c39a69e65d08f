from __future__ import annotations

import pytest
from fakellm import FakeLLM

from examforge.llm import LLMClient
from examforge.pipeline import Runtime, process_chapter
from examforge.syllabus import load_syllabus
from helpers import write_syllabus
from storage import Store, connect, migrate


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_smoke(make_settings, backend, request):
    url = request.getfixturevalue("pg_url") if backend == "postgres" else None
    settings = make_settings(**({"database_url": url} if url else {}))
    path = write_syllabus(settings.exams_dir, "ex", [("a", 12), ("b", 5)])
    syl = load_syllabus(path, max_questions=100)
    engine = connect(settings.database_url)
    migrate(engine)
    store = Store(engine)
    plan = store.sync_exam("ex", syl)
    assert plan.to_enqueue == ["a", "b"]
    fake = FakeLLM()
    rt = Runtime.build(settings, store, LLMClient(settings, transport=fake.transport()))
    r = process_chapter(rt, "ex", "a")
    assert r.outcome == "done", r
    assert fake.calls == 3
    r = process_chapter(rt, "ex", "a")
    assert r.outcome == "skipped"
    assert fake.calls == 3
    st = store.status("ex")
    assert st["questions"]["done"] == 12
