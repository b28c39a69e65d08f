"""The peer, bespokelabs-curator (bench/curator_peer.py in its own venv, offline, as
/work/shared/PEERS.md says), doing the same requests against the same mock."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from bench.measure import (
    child_pythonpath,
    BENCH,
    ROOT,
    MockProbe,
    Result,
    record_child_report,
    stop_child,
)


def curator_env(python: str, scratch: Path) -> dict[str, str] | str:
    """The offline environment curator needs, or why it cannot run."""
    if not Path(python).exists():
        return f"no curator venv at {python}"
    site = subprocess.run([python, "-c", ("import litellm, os; print(os.path.dirname("
                           "litellm.__file__))")], check=False, capture_output=True, text=True,
                          timeout=120)
    if site.returncode != 0:
        return "litellm not importable in the curator venv"
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HF_"))}
    env.update({
        "TIKTOKEN_CACHE_DIR": str(Path(site.stdout.strip()) / "litellm_core_utils" / "tokenizers"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
        "TELEMETRY_ENABLED": "false", "CURATOR_VIEWER": "0", "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(scratch),
        "HF_HOME": str(scratch / "hf"), "CURATOR_CACHE_DIR": str(scratch / "cache"),
        "PYTHONPATH": child_pythonpath(),
    })
    return env


def run_curator(mock: MockProbe, workdir: Path, targets: list[int], calls_needed: int,
                qpc: int, slots: int, python: str) -> Result:
    slug = f"cur-{uuid.uuid4().hex[:6]}"
    res = Result("curator", f"bespokelabs-curator, backend openai, max_concurrent_requests "
                 f"{slots}", sum(targets), calls_needed, chapters=len(targets), slots=slots,
                 latency_s=mock.latency_s, command=f"{python} bench/curator_peer.py ...")
    scratch = workdir / "curator-home"
    env = curator_env(python, scratch)
    if isinstance(env, str):
        res.error = env
        return res
    rows = []
    for i, t in enumerate(targets):
        for start in range(0, t, qpc):
            rows.append({"chapter": i, "want": min(qpc, t - start)})
    spec = {"base_url": mock.url, "slug": slug, "rows": rows, "concurrency": slots,
            "working_dir": str(scratch / f"work-{slug}"), "out": str(workdir / f"{slug}.jsonl")}
    spec_path = workdir / f"{slug}.json"
    spec_path.write_text(json.dumps(spec))
    mock.arm(slug)
    launched = time.monotonic()
    proc = subprocess.Popen([python, str(BENCH / "curator_peer.py"), str(spec_path)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        stop_child(proc)
        res.error = "timed out"
        return res
    (workdir / f"{slug}.stderr").write_bytes(stderr)
    if proc.returncode != 0:
        res.error = f"exit {proc.returncode}: " + stderr.decode(errors="replace")[-800:]
        return res
    report = record_child_report(res, stdout, launched, mock)
    res.questions_stored = report["stored"]
    res.calls_paid, res.calls_other = mock.calls_for(slug)
    res.max_inflight = mock.max_inflight()
    res.notes.append(f"{res.calls_other} probe request(s) with empty messages at construction, "
                     "not counted as paid calls")
    if report.get("invalid"):
        res.notes.append(f"{report['invalid']} rows with invalid output")
    if report.get("children_cpu_s"):
        res.notes.append(f"{report['children_cpu_s'] * 1000:.0f} ms CPU in child processes "
                         "(in the start-up column only)")
    res.notes.append("one request per row, no per-chapter avoid list; curator "
                     f"{report.get('version', '?')}")
    return res
