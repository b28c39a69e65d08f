"""Draw README's picture of the live view (`status --watch`) from a real, half-finished run:

    python docs/live_view.py        # writes docs/live-view.svg

An exam of four chapters is generated part of the way against the mock (with a few faults, so
the view has errors to show), then the view is rendered as `status --watch` draws it on a
terminal, and saved with rich's own SVG export.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from rich.console import Console

    from runner.pipeline import Runtime, process_chapter
    from examforge.settings import Settings
    from examforge.syllabus import load_syllabus
    from mockllm import MockConfig, MockServer
    from producer.live import render
    from storage import open_store

    mock = MockServer(MockConfig(latency_s=0.3, fault_rate=0.15, seed=3,
                                 faults=["429", "503", "truncated", "duplicate"]))
    url = mock.start()
    with tempfile.TemporaryDirectory() as tmp:
        exams = Path(tmp) / "exams" / "cloud-practitioner"
        exams.mkdir(parents=True)
        (exams / "syllabus.json").write_text(
            '{"title": "AWS Cloud Practitioner", "chapters": ['
            '{"id": "cloud-concepts", "title": "Cloud concepts", "questions": 120},'
            '{"id": "security", "title": "Security and compliance", "questions": 120},'
            '{"id": "technology", "title": "Technology and services", "questions": 150},'
            '{"id": "billing", "title": "Billing and pricing", "questions": 60}]}')
        settings = Settings(database_url=f"sqlite:///{tmp}/ef.db", llm_base_url=url,
                            exams_dir=Path(tmp) / "exams", retry_base_s=0.01,
                            llm_price_prompt_per_mtok=0.15, llm_price_completion_per_mtok=0.6)
        store = open_store(settings.database_url)
        plan = store.sync_exam("cloud-practitioner",
                               load_syllabus(exams / "syllabus.json", max_questions=500),
                               budget_usd=2.0, slice_questions=settings.slice_questions)
        rt = Runtime.build(settings, store)
        # About two thirds of the slices, some of them twice (a retry after a fault).
        work = plan.slices[: len(plan.slices) * 2 // 3]
        threads = [threading.Thread(target=process_chapter, args=(rt, "cloud-practitioner", *s))
                   for s in work]
        for t in threads:
            t.start()
        # Drawn mid-run, as a person watching sees it.
        while store.questions_done("cloud-practitioner") < 180:
            threading.Event().wait(0.02)
        report = store.status("cloud-practitioner")
        for t in threads:
            t.join()
        rt.close()
        store.engine.dispose()
    mock.stop()
    console = Console(record=True, width=110, force_terminal=True)
    console.print(render(report))
    target = ROOT / "docs" / "live-view.svg"
    console.save_svg(str(target), title="python -m producer status cloud-practitioner --watch")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
