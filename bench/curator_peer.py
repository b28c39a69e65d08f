"""The peer, bespokelabs-curator, doing the benchmark's work; run by bench/throughput.py.

Runs in curator's own venv (/tmp/curator-venv, see /work/shared/PEERS.md) with the offline
environment set by the caller. Argument: a JSON spec {base_url, slug, rows, concurrency,
working_dir, out}. Prints one JSON line: stored, invalid, work_s, work_cpu_s, total_cpu_s,
done_monotonic, version.

Each row is one request for `want` questions of a chapter, built with examforge's own
`build_messages` (so the mock sees the same prompt lines) and validated with examforge's
`parse_questions` in curator's `parse`. Curator has no notion of a chapter's earlier batches,
so no "avoid" list is sent; the mock numbers questions per chapter, so they are still unique.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.loads(f.read())
    from bespokelabs import curator
    from datasets import Dataset

    from examforge.errors import OutputInvalid
    from examforge.output import parse_questions
    from examforge.prompt import build_messages
    from examforge.syllabus import Chapter

    slug = spec["slug"]
    title = f"Benchmark exam {slug}"
    counters = {"invalid": 0}

    class ExamQuestions(curator.LLM):
        def prompt(self, row):  # type: ignore[no-untyped-def]
            chapter = Chapter(id=f"ch-{row['chapter']:03d}", title=f"Topic number {row['chapter']}",
                              questions=row["want"])
            return build_messages(slug, title, chapter, row["want"], [])

        def parse(self, row, response):  # type: ignore[no-untyped-def]
            try:
                parsed = parse_questions(response, "stop", row["want"], set())
            except OutputInvalid:
                counters["invalid"] += 1
                return []
            return [{"chapter": row["chapter"], "question": q.question,
                     "choices": list(q.choices), "answer_index": q.answer_index,
                     "explanation": q.explanation} for q in parsed.questions]

    dataset = Dataset.from_list(spec["rows"])
    generation: dict[str, object] = {"temperature": 0.7}
    if spec.get("max_tokens"):  # the same cap examforge sends (bench/ratelimit.py)
        generation["max_tokens"] = spec["max_tokens"]
    llm = ExamQuestions(
        model_name="mock-model",
        backend="openai",
        generation_params=generation,
        backend_params={
            "base_url": spec["base_url"], "api_key": "sk-mock",
            "max_requests_per_minute": spec.get("rpm") or 1_000_000,
            "max_tokens_per_minute": spec.get("tpm") or 1_000_000_000,
            "max_concurrent_requests": spec["concurrency"], "max_retries": 3,
        },
    )  # the construction-time probe request happens here, before the timed window
    t0, c0 = time.monotonic(), time.process_time()
    result = llm(dataset, working_dir=spec["working_dir"])
    out = result.dataset if hasattr(result, "dataset") else result
    rows = out.to_list()
    with open(spec["out"], "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    t1, c1 = time.monotonic(), time.process_time()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # in case curator forked helpers
    keys = {(r["chapter"], r["question"]) for r in rows}
    from importlib.metadata import version

    print(json.dumps({"stored": len(keys), "rows": len(rows), "invalid": counters["invalid"],
                      "work_s": t1 - t0, "work_cpu_s": c1 - c0,
                      "total_cpu_s": ru.ru_utime + ru.ru_stime + kids.ru_utime + kids.ru_stime,
                      "children_cpu_s": kids.ru_utime + kids.ru_stime, "done_monotonic": t1,
                      "version": version("bespokelabs-curator")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
