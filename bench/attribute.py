"""Where a one-call chapter's worker CPU goes, by what it buys: a py-spy `--format raw --gil`
profile of the worker (`python -m bench --only overhead --profile`) cut into categories, each
stack counted once, in the first category it matches (docs/explanations/benchmarks.md, "Why
the CPU and scaling targets are not met").

    python bench/attribute.py bench/profile-overhead-gil.txt storage/ledger.py [CPU_MS]

The commit's statements are told apart by the line of `Ledger._commit` they run from (read
from storage/ledger.py as it is). With CPU_MS, the CPU a chapter of the profiled run, each
share is also given in µs. Then the frames of what fell in no named category."""
import re, sys
from collections import Counter

prof, ledger = sys.argv[1], sys.argv[2]
ms = float(sys.argv[3]) if len(sys.argv) > 3 else None
src = open(ledger).read().splitlines()
start = next(i for i, l in enumerate(src, 1) if l.startswith("    def _commit(self"))
def line_of(pat, after=start):
    return next(i for i, l in enumerate(src, 1) if i > after and re.search(pat, l))
fence = line_of(r'self\._run\(conn, "fence"')
exam = line_of(r'"commit_exam"|self\._exam_first\(conn, claim\.exam\)', start) if False else None
lock_ = line_of(r'shared = claim\.chapter_target')
exam_read = line_of(r'exam_row = None if self\._raw')
free = line_of(r'free = self\._free_numbers')
rows_ = line_of(r'rows = \[')
order = line_of(r'self\._questions_in_order')
index = line_of(r'neardup\.index\(conn')
prog = index + 1
fin = line_of(r'if not self\._finish\(conn')
result = line_of(r'result = Committed\(')
def commit_line(stack):
    m = re.findall(r"_commit \(storage/ledger\.py:(\d+)\)", stack)
    return int(m[-1]) if m else None

CATS = [
 ("idle / waiting (leaf in a lock or select)", None),
 ("near-duplicate signing (outside the transaction)", r"Signed\.many|sign_many|Signed\.groups"),
 ("steering list (stored questions the next prompt lists)", r"steered \(|steering \(storage|_steer_statement|steering_of"),
 ("near-duplicate check and index (in the commit)", r"\(storage/neardup\.py|check_local|add_own|\(examforge/neardup"),
 ("prompt, token counting, rate limiter (planning the call)", r"\(examforge/prompt\.py|\(tiktoken|\(examforge/tokens\.py|\(examforge/ratelimit\.py|\(examforge/estimate\.py|\(examforge/sizing\.py|\(examforge/sources\.py"),
 ("answer balancing (examforge.balance)", r"\(examforge/balance\.py"),
 ("commit: numbering (free numbers, question order)", r"_free_numbers|_questions_in_order"),
 ("commit: fence statement", "FENCE"),
 ("ledger (call row, settle, usage, budget, failed logins)", r"_finish \(storage|_settle \(storage|_budgeted|_start_planned|start_call \(storage|_exam_first|finish_call|_waste_orphaned_calls"),
 ("commit: questions' insert, exam read, slice progress", "INSERT"),
 ("claim: lease, slice and chapter reads (rest of the claim)", r"Leases\.claim \(|_claim \(storage|_read_claimed"),
 ("may_send (the send check's read)", r"may_send \("),
 ("PostgreSQL one-statement commit (fastpath params + round trip)", r"_commit_fast|\(storage/fastpath\.py"),
 ("group commit machinery, transactions (BEGIN/COMMIT/SAVEPOINT), writer lock", r"\(storage/group\.py|_write \(storage|FileTurn|WriterLock|_Turn|do_commit|_on_begin|begin_nested|savepoint"),
 ("commit: other (result, Python around it)", r"commit_batch \("),
 ("the model call (httpx, httpcore, h11, socket, request JSON)", r"\((httpx|httpcore|h11|anyio|ssl|socket)/|\(examforge/llm\.py"),
 ("reply parsing and validation (examforge.output, pydantic, json)", r"\(examforge/output\.py|\(examforge/reply_schema\.py|\(pydantic|\(json/|\(examforge/item_types\.py|\(examforge/languages\.py"),
 ("logging", r"\(logging/|\(examforge/logs\.py|\(structlog"),
 ("lease heartbeat thread", r"\(runner/heartbeat\.py"),
 ("other store (storage/)", r"\(storage/"),
 ("task's other work (runner.pipeline, tasks.app)", r"generate_chapter \(tasks/app\.py|process_chapter"),
 ("Celery, kombu and redis-py outside the task (receive, ack)", r"\((celery|kombu|redis|billiard|vine|amqp)/"),
 ("other", r""),
]
def classify(stack):
    leaf = stack.rsplit(";", 1)[-1]
    cl = commit_line(stack)
    for name, pat in CATS:
        if pat is None:
            continue
        if pat == "FENCE":
            if cl is not None and fence <= cl < exam_read and not re.search(r"\(storage/neardup\.py", stack):
                return name
            continue
        if pat.startswith(r"\(storage/group"):
            tail = stack[stack.rfind("(storage/group.py"):] if "(storage/group.py" in stack else stack
            if re.search(pat, tail) and not re.search(r"\(storage/(ledger|leases)\.py", tail):
                return name
            continue
        if pat == "INSERT":
            if cl is not None and (rows_ <= cl < fin or exam_read <= cl < lock_):
                return name
            continue
        if re.search(pat, stack):
            return name
    return "other"

counts: Counter[str] = Counter()
total = 0
for line in open(prof):
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if not count.isdigit():
        continue
    total += int(count)
    counts[classify(stack)] += int(count)
print(f"{total} GIL samples; lines: fence {fence} lock {lock_} free {free} rows {rows_} fin {fin}")
for category, _pattern in CATS:
    if counts[category]:
        share = counts[category] / total
        extra = f" | {share * ms * 1000:.0f} µs" if ms else ""
        print(f"| {category} | {share:.1%}{extra} |")

other: Counter[tuple[str, str]] = Counter()
for line in open(prof):
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if count.isdigit() and classify(stack) in ("other", "task's other work (runner.pipeline, tasks.app)", "other store (storage/)"):
        frames = [f for f in stack.split(";") if "(" in f]
        other[(classify(stack)[:10], re.sub(r":\d+\)", ")", frames[-1]) if frames else "?")] += int(count)
for (c, f), samples in other.most_common(25):
    print(f"  {c:10} {samples / total:.1%} {f}")
