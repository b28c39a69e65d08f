"""The plots of `python -m bench` (PNG, beside the results file): throughput against slots
(the threads part) and against worker processes (the scaling part), each with the ideal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _runs(parts: Sequence[Any], name: str) -> list[dict[str, Any]]:
    for p in parts:
        if p.name == name and not p.error:
            return list(p.runs)
    return []


def plot_all(parts: Sequence[Any], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    threads = [r for r in _runs(parts, "threads") if r.get("calls_per_s")]
    if threads:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        slots = sorted({r["slots"] for r in threads})
        latency = threads[0]["latency_s"]
        ax.plot(slots, [s / latency for s in slots], "k--", label=f"ideal: slots / {latency} s")
        for label, pick in (("asyncio baseline", lambda r: r["system"] == "baseline"),
                            ("examforge, 1 worker, SQLite",
                             lambda r: r["system"].startswith("examforge"))):
            pts = sorted((r["slots"], r["calls_per_s"]) for r in threads if pick(r))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(slots, [str(s) for s in slots])
        ax.set_xlabel("slots (threads, or the baseline's semaphore)")
        ax.set_ylabel("paid calls per second")
        ax.set_title("Throughput against slots (50-question chapters)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        path = out_dir / "plot-slots.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    scaling = [r for r in _runs(parts, "scaling") if r.get("calls_per_s")]
    if scaling:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        workers = sorted({r["workers"] for r in scaling})
        ideal = scaling[0]["slots"] / scaling[0]["latency_s"]
        ax.plot(workers, [ideal] * len(workers), "k--",
                label=f"ideal: {scaling[0]['slots']} slots / {scaling[0]['latency_s']} s")
        for database in sorted({r["database"] for r in scaling}):
            pts = sorted((r["workers"], r["calls_per_s"]) for r in scaling
                         if r["database"] == database)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"examforge, {database}")
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_ylim(0, ideal * 1.1)
        ax.set_xlabel(f"worker processes ({scaling[0]['slots']} threads in all)")
        ax.set_ylabel("paid calls per second")
        ax.set_title("Throughput against worker processes (2 cores)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        path = out_dir / "plot-workers.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
