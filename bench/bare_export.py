"""The `export` part's baseline: a bare sqlite3 + json loop writing the same JSON Lines as
`python -m producer export SLUG --format jsonl`, byte for byte (the part checks it).

    python bench/bare_export.py DB SLUG OUT

Run as a script, not as `-m bench...`: importing the `bench` package (the store, SQLAlchemy
and the seeder) would add about 0.6 s of start-up to the baseline and flatter the ratio.
It imports nothing beyond the standard library's sqlite3, json and datetime."""

import json
import sqlite3
import sys
from datetime import datetime, timezone


def main(db: str, slug: str, out: str) -> int:
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT q.exam, q.chapter_id, q.number, q.question, q.choices, q.answer_index, "
        "q.explanation, q.difficulty, q.bloom, q.source, q.verdict, q.model, q.created_at, "
        "q.type, q.answer "
        "FROM question q "
        "JOIN slice c ON c.exam = q.exam AND c.chapter_id = q.chapter_id "
        "AND q.number >= c.first_number AND q.number < c.first_number + c.target "
        "WHERE q.exam = ? AND q.review <> 'rejected' "
        "ORDER BY c.position, c.chapter_id, q.number", (slug,))
    utc = timezone.utc
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.writelines(json.dumps({
            "exam": r[0], "chapter_id": r[1], "number": r[2], "question": r[3],
            "choices": json.loads(r[4]), "answer_index": r[5], "explanation": r[6],
            "difficulty": r[7], "bloom": r[8], "source": r[9], "verdict": r[10], "model": r[11],
            "created_at": datetime.fromtimestamp(r[12], utc).isoformat(timespec="seconds"),
            "type": r[13], **answer_fields(r[13], r[14]),
        }, ensure_ascii=False) + "\n" for r in rows)
    return 0


def answer_fields(kind: str, answer: str | None) -> dict:
    """An item type's answer fields, as examforge.item_types.reply_fields writes them."""
    if kind == "mcq":
        return {}
    stored = json.loads(answer) if answer else {}
    if kind == "truefalse":
        return {"answer": stored.get("value")}
    if kind in ("multi", "short"):
        name = "correct" if kind == "multi" else "accepted"
        return {name: list(stored.get(name, ()))}
    return {name: stored.get(name) for name in ("value", "tolerance", "relative", "unit")}


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
