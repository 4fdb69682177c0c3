"""How usage reads in the task log (``core.jobs.usage.summary_line``): amounts, waits,
plurals, and what failures cost a task (its failed attempts and their chip-hours per
failure class, ``core.spec.failure``), for the usage line and ``kinetic_usage``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def amount(value: float) -> str:
    """1.9, 0.042, 0.0014: never scientific notation (a short job's chip-hours)."""
    if not value:
        return "0"
    if value < 0.0001:
        return "<0.0001"
    return f"{value:.1f}" if value >= 0.1 else f"{value:.4f}".rstrip("0").rstrip(".")


def wait(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def failure_class_of(entry: Mapping[str, Any]) -> str | None:
    """The failure class a job's history entry recorded (None: it did not fail)."""
    return (entry.get("failure") or {}).get("class")


def lost_to_failures(detail: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{class: {"attempts": n, "chip_hours": h}}`` over the attempts that failed."""
    failures: dict[str, dict[str, Any]] = {}
    for u in detail:
        if u.get("failure_class"):
            lost = failures.setdefault(u["failure_class"], {"attempts": 0, "chip_hours": 0.0})
            lost["attempts"] += 1
            lost["chip_hours"] += u.get("chip_hours") or 0.0
    return failures


def lost_line(failures: Mapping[str, Mapping[str, Any]]) -> str:
    """``failed: 2 infra (0.3 chip-hours), 1 user_error``."""
    each = []
    for name, f in failures.items():
        hours = f" ({amount(f['chip_hours'])} chip-hours)" if f.get("chip_hours") else ""
        each.append(f"{f['attempts']} {name}{hours}")
    return "failed: " + ", ".join(each)
