#!/usr/bin/env bash
# Install examforge in .venv and generate the sample exam end to end against the bundled mock
# model server (no API key needed). Uses the Redis at BROKER_URL (default localhost:6379) and a
# SQLite file in ./demo-run/; with --local it needs no Redis at all (`producer run`).
set -euo pipefail
cd "$(dirname "$0")"
SLUG=cloud-practitioner

usage() {
  cat <<EOF
usage: ./demo.sh [--local] [--fresh] [--language TAG]

Generates the sample exam ($SLUG) against the bundled mock model server.
  (default)  Celery workers on the Redis at BROKER_URL (default redis://localhost:6379/0)
  --local    one process, no Redis (python -m producer run)
  --fresh    delete demo-run/ (the demo's database and logs) first; otherwise a rerun reuses
             it, and generates only what is missing
  --language the sample exam in another language: fa (Persian), ar (Arabic), ru (Russian),
             or en (the default); its bank is exported in every format, and as a CSV with a
             byte-order mark for spreadsheet programs
  -h, --help this text
EOF
}

MODE=workers
FRESH=
LANGUAGE=en
while [ $# -gt 0 ]; do
  arg="$1"
  case "$arg" in
    --local) MODE=local ;;
    --fresh) FRESH=1 ;;
    --language=*) LANGUAGE="${arg#--language=}" ;;
    --language) LANGUAGE="${2:-}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo.sh: unknown option '$arg' (see ./demo.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$LANGUAGE" in
  en) ;;
  fa|ar|ru) SLUG="$SLUG-$LANGUAGE" ;;
  *) echo "demo.sh: --language '$LANGUAGE': no sample exam in that language (known: en, fa, ar, ru)" >&2; exit 2 ;;
esac

if [ -n "$FRESH" ]; then
  if [ -n "${DATABASE_URL:-}" ]; then
    echo "demo.sh: --fresh clears only demo-run/, and DATABASE_URL is set: clear that database yourself, or unset DATABASE_URL" >&2
    exit 2
  fi
  rm -rf demo-run
  echo "demo.sh: --fresh: removed demo-run/"
elif [ -z "${DATABASE_URL:-}" ] && [ -e demo-run/examforge.db ]; then
  echo "demo.sh: reusing demo-run/examforge.db from an earlier run: what it holds is kept and only missing questions are generated (./demo.sh --fresh starts over)"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# Installed through the lock, with pip's progress shown (the first install takes a minute or
# two). The stamp in .venv holds a hash of what the install read: a rerun with the same
# pyproject.toml and lock skips it (a new .venv has no stamp).
STAMP=.venv/examforge-install.sha256
wanted="$(cat pyproject.toml requirements/lock.txt | sha256sum | cut -d' ' -f1)"
# A .venv made by README's own install line has no stamp but holds exactly the lock: that
# is read off its installed packages (a tenth of a second), and stamped. Only with no stamp:
# a stamp that differs means pyproject.toml or the lock changed since the install, and a
# changed pyproject.toml (a new package or script) needs the install whatever the lock says.
holds_the_lock() {
  .venv/bin/python -I - <<'PY' 2>/dev/null  # -I: not the source tree's egg-info
import json, re, sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
for line in Path("requirements/lock.txt").read_text().splitlines():
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", line.strip())
    if m:  # a line with an environment marker does not match, and is not checked
        try:
            if version(m[1]) != m[2]:
                sys.exit(1)
        except PackageNotFoundError:
            sys.exit(1)
url = json.loads(distribution("examforge").read_text("direct_url.json") or "{}")
sys.exit(0 if url.get("url") == Path.cwd().as_uri() and url.get("dir_info", {}).get("editable") else 1)
PY
}
if [ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ]; then
  echo "demo.sh: .venv is up to date (pyproject.toml and requirements/lock.txt unchanged since its install): install skipped"
elif [ ! -e "$STAMP" ] && holds_the_lock; then
  echo "demo.sh: .venv already holds examforge and every package at requirements/lock.txt's version: install skipped"
  echo "$wanted" >"$STAMP"
else
  echo "demo.sh: installing examforge into .venv, pinned by requirements/lock.txt..."
  .venv/bin/python -m pip install -c requirements/lock.txt -e '.[dev]'
  echo "$wanted" >"$STAMP"
fi
PY="$PWD/.venv/bin/python"

mkdir -p demo-run
export EXAMS_DIR="$PWD/exams"
export DATABASE_URL="${DATABASE_URL:-sqlite:///$PWD/demo-run/examforge.db}"
export BROKER_URL="${BROKER_URL:-redis://localhost:6379/0}"
export LLM_BASE_URL="http://127.0.0.1:8089/v1"
export LLM_PRICE_PROMPT_PER_MTOK=0.15 LLM_PRICE_COMPLETION_PER_MTOK=0.60  # what a small model costs

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$PY" -m producer mock-llm --port 8089 --latency-s 0.3 >demo-run/mock.log 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do grep -q listening demo-run/mock.log 2>/dev/null && break; sleep 0.1; done

if [ "$MODE" = local ]; then
  "$PY" -m producer run "$SLUG" --concurrency 8
else
  # -l info: a line per committed batch (Celery's default level, WARNING, hides them).
  "$PY" -m celery -A tasks worker -P threads -c 16 -l info >demo-run/worker.log 2>&1 &
  pids+=($!)
  "$PY" -m producer enqueue "$SLUG"
  echo "waiting for the workers (log: demo-run/worker.log)..."
  until "$PY" -m producer status "$SLUG" --json | "$PY" -c '
import json, sys
c = json.load(sys.stdin)["chapters"]
sys.exit(0 if c["done"] + c["failed"] + c["cancelled"] == c["total"] else 1)'; do sleep 1; done
fi
"$PY" -m producer status "$SLUG"
"$PY" -m producer export "$SLUG"
head -n 1 "exams/$SLUG/generated.jsonl"
# The same bank for Moodle (XML and GIFT), Anki and Canvas: docs/reference/export-formats.md.
for format in moodle-xml gift anki qti; do "$PY" -m producer export "$SLUG" --format "$format"; done
if [ "$LANGUAGE" != en ]; then "$PY" -m producer export "$SLUG" --format csv --bom; fi
# The exact line to look again: examforge is installed in .venv only (a plain `python` outside
# it lacks its packages), and the demo's database is not the CLI's default ./examforge.db.
echo "demo.sh: done; to look at it again: DATABASE_URL=$DATABASE_URL .venv/bin/python -m producer status $SLUG"
