"""`producer prune`: its DURATION option and what it prints."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from producer.words import plural

if TYPE_CHECKING:  # the CLI imports this module on every start: keep it light
    from storage.housekeeping import Footprint, PruneResult

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"(\d+)([smhd])")


def parse_duration_s(text: str) -> float:
    """`30m`, `12h`, `7d`, `0s`: a whole number and one unit, in seconds; ValueError else."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: a whole number and s, m, h or d "
                         "(30m, 12h, 7d, 0s)")
    return float(int(match.group(1)) * _UNITS_S[match.group(2)])


class Duration(NamedTuple):
    text: str  # as given: "7d"
    seconds: float


class DurationType(click.ParamType):
    """A click option of type DURATION (see parse_duration_s)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Duration:
        if isinstance(value, Duration):
            return value
        try:
            return Duration(str(value).strip(), parse_duration_s(str(value)))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _describe(fp: Footprint) -> str:
    when = datetime.fromtimestamp(fp.last_change_at, timezone.utc).isoformat(timespec="seconds")
    return (f"{plural(fp.chapters, 'chapter')} ({plural(fp.slices, 'slice')}), "
            f"{plural(fp.questions, 'question')}, {plural(fp.calls, 'call')} "
            f"(${fp.cost_usd:.4f}); last change {when} ({_age(fp.age_s)} ago)")


def report_lines(result: PruneResult, *, dry_run: bool, older_than: str) -> list[str]:
    verb = "would prune" if dry_run else "pruned"
    lines = [f"{verb:<12}{fp.exam}: {_describe(fp)}" for fp in result.pruned]
    lines += [f"{'kept':<12}{fp.exam}: {plural(fp.active_slices, 'slice')} pending or running"
              for fp in result.running]
    lines += [f"{'kept':<12}{fp.exam}: last change {_age(fp.age_s)} ago, within {older_than}"
              for fp in result.recent]
    lines += [f"{'busy':<12}{slug}: another transaction holds its rows; not pruned, try again"
              for slug in result.busy]
    lines.append(
        f"{verb} {plural(len(result.pruned), 'exam')} "
        f"({plural(sum(f.questions for f in result.pruned), 'question')}, "
        f"{plural(sum(f.calls for f in result.pruned), 'call')}); kept "
        f"{len(result.running)} pending or running, {len(result.recent)} changed within "
        f"{older_than}" + (f", {len(result.busy)} busy" if result.busy else "")
        + ("; dry run: nothing was deleted" if dry_run else ""))
    return lines
