"""A finished exam of any size, written straight into a database: the exam and its chapters
through the store's own `sync_exam`, then the questions and their calls in bulk SQL (one
executemany per table), every chapter marked done. What `export` and `status` read is then
what a real run leaves behind, without paying for the run."""

from __future__ import annotations

import json
import random
import time

from sqlalchemy import func, insert, select, update

from examforge.syllabus import Chapter, Syllabus
from storage import open_store
from storage.base import K, Q, S

WORDS = ["photosynthesis", "mitochondria", "enzyme", "membrane", "osmosis", "catalyst", "nucleus", "ribosome", "protein", "gradient", "equilibrium", "molecule", "absorption", "reaction", "cellular", "energy"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def seed_exam(db_url: str, slug: str, questions: int, chapters: int,
              per_call: int = 10) -> None:
    """`questions` stored questions in `chapters` chapters, `per_call` per used call."""
    per_chapter = -(-questions // chapters)
    store = open_store(db_url)
    targets = [min(per_chapter, questions - i * per_chapter) for i in range(chapters)]
    syllabus = Syllabus(title=f"Seeded exam {slug}", chapters=[
        Chapter(id=f"ch-{i:05d}", title=f"Topic number {i}", questions=t)
        for i, t in enumerate(targets) if t > 0])
    store.sync_exam(slug, syllabus)
    rng = random.Random(7)
    now = time.time()
    call_rows, question_rows = [], []
    with store.engine.connect() as conn:  # ids go on from the exams seeded before
        call_id = conn.execute(select(func.coalesce(func.max(K.c.id), 0))).scalar_one()
    for ch in syllabus.chapters:
        for first in range(1, ch.questions + 1, per_call):
            call_id += 1
            n = min(per_call, ch.questions - first + 1)
            call_rows.append({
                "id": call_id, "exam": slug, "chapter_id": ch.id, "attempt": 1,
                "first_number": first, "requested": n, "worker": "seed", "outcome": "used",
                "status_code": 200, "prompt_tokens": 300, "completion_tokens": 150 * n,
                "cost_usd": 0.0001 * n, "questions_stored": n, "endpoint": "primary",
                "model": "mock-model", "max_tokens": 100 + 400 * n, "started_at": now,
                "finished_at": now})
            for number in range(first, first + n):
                question_rows.append({
                    "exam": slug, "chapter_id": ch.id, "number": number,
                    "question": f"Q{number}: which {_text(rng, 12)}?",
                    "choices": json.dumps([_text(rng, 4) for _ in range(4)]),
                    "answer_index": rng.randrange(4), "explanation": _text(rng, 25),
                    "model": "mock-model", "call_id": call_id, "created_at": now})
    with store.engine.begin() as conn:
        for start in range(0, len(call_rows), 5000):
            conn.execute(insert(K), call_rows[start:start + 5000])
        for start in range(0, len(question_rows), 5000):
            conn.execute(insert(Q), question_rows[start:start + 5000])
        conn.execute(update(S).where(S.c.exam == slug).values(state="done"))
    store.engine.dispose()
