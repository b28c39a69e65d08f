"""The mock's runtime behaviour: one validated dataclass, changeable at runtime via ``/_config``."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mockllm.faults import ALL_FAULTS, DEFAULT_FAULTS, OK


def _as_name_list(value: Any, allowed: Iterable[str], what: str) -> list[str]:
    """Accept a list or a comma-separated string of names, all in ``allowed``."""
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, (list, tuple)):
        names = [str(part).strip() for part in value]
    else:
        raise ValueError(f"{what} must be a list of names or a comma-separated string")
    allowed_set = set(allowed)
    unknown = [name for name in names if name not in allowed_set]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(sorted(allowed_set))})")
    return names


def _non_negative_float(value: Any, name: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return number


@dataclass
class MockConfig:
    """Runtime behaviour of the mock; every field can be changed via ``/_config``.

    ``script`` maps a chapter key (``"<slug>/<chapter_id>"``) to the outcomes
    (fault names or ``"ok"``) of that chapter's next calls, consumed in order;
    once a chapter's list is used up, normal behaviour (including random
    faults) resumes.
    """

    latency_s: float = 0.05
    questions_per_reply: int | None = None
    api_key: str | None = None
    fault_rate: float = 0.0
    faults: list[str] = field(default_factory=lambda: list(DEFAULT_FAULTS))
    seed: int = 0
    retry_after_s: float = 1.0
    stall_s: float = 30.0
    script: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalising here means both the constructor and dataclasses.replace
        # (used for runtime updates) reject bad values before they take effect.
        self.latency_s = _non_negative_float(self.latency_s, "latency_s")
        self.retry_after_s = _non_negative_float(self.retry_after_s, "retry_after_s")
        self.stall_s = _non_negative_float(self.stall_s, "stall_s")
        self.fault_rate = _non_negative_float(self.fault_rate, "fault_rate")
        if self.fault_rate > 1:
            raise ValueError("fault_rate must be between 0 and 1")
        if self.questions_per_reply is not None:
            self.questions_per_reply = int(self.questions_per_reply)
            if self.questions_per_reply < 0:
                raise ValueError("questions_per_reply must be >= 0 or null")
        self.api_key = str(self.api_key) if self.api_key else None
        self.seed = int(self.seed)
        self.faults = _as_name_list(self.faults, ALL_FAULTS, "fault")
        if not isinstance(self.script, dict):
            raise ValueError("script must map chapter keys to lists of outcomes")
        self.script = {
            str(key): _as_name_list(outcomes, (*ALL_FAULTS, OK), "script outcome")
            for key, outcomes in self.script.items()
        }

    def updated(self, updates: dict[str, Any]) -> MockConfig:
        """Return a validated copy with ``updates`` applied; raise ValueError on bad input."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(updates) - known)
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(unknown)}")
        try:
            return dataclasses.replace(copy.deepcopy(self), **updates)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready copy of the config."""
        return dataclasses.asdict(self)
