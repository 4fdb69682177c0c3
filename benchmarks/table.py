"""The benchmark's one table: case, baseline, ours, ratio, goal, pass/fail."""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Row:
    """One measured case.  ``ratio`` is baseline time / our time (> 1: ours faster);
    ``goal`` is the least ratio that passes (None: the row is informational or its
    goal is not a ratio, then ``passed`` says; ``added``: a limit on ours - baseline)."""

    case: str
    baseline: str
    ours: str
    ratio: float | None
    goal: str
    passed: bool | None
    note: str = ""

    @classmethod
    def timed(
        cls, case: str, base_name: str, t_base: float, t_ours: float, goal: float | None,
        note: str = "",
    ) -> Row:  # fmt: skip
        ratio = t_base / t_ours if t_ours > 0 else float("inf")
        return cls(
            case, f"{base_name} {t_base:.3f} s", f"{t_ours:.3f} s", ratio,
            f">= {goal:g}x" if goal is not None else "(info)",
            None if goal is None else ratio >= goal, note,
        )  # fmt: skip

    @classmethod
    def added(
        cls, case: str, base_name: str, t_base: float, t_ours: float, max_extra: float | None,
        note: str = "", ok: bool = True,
    ) -> Row:  # fmt: skip
        """A goal on the time ours adds to the baseline's (a fixed cost, where a ratio
        to a near-zero baseline would say nothing); ``ok=False``: it failed outright."""
        extra = t_ours - t_base
        return cls(
            case, f"{base_name} {t_base:.3f} s", f"{t_ours:.3f} s (+{extra:.3f} s)", None,
            f"<= +{max_extra:g} s" if max_extra is not None else "(info)",
            (None if ok else False) if max_extra is None else ok and extra <= max_extra, note,
        )  # fmt: skip

    @classmethod
    def skipped(cls, case: str, why: str) -> Row:
        return cls(case, "-", "-", None, "-", None, f"skipped: {why}")

    @property
    def result(self) -> str:
        if self.note.startswith("skipped"):
            return "skipped"
        return {True: "pass", False: "FAIL", None: "info"}[self.passed]


def best(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    """Fastest of ``repeat`` runs (seconds) and the last value."""
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), value  # type: ignore[return-value]


def machine() -> str:
    """CPU model, cores, memory, OS and Python: what docs/PERFORMANCE.md records with the table."""
    model = platform.processor() or platform.machine()
    mem = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
            mem = f", {kib / 1024**2:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return (
        f"{model}, {os.cpu_count()} CPUs{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def render(rows: list[Row], title: str) -> str:
    """A Markdown table (it goes into docs/PERFORMANCE.md as printed)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{title} - {now}",
        f"machine: {machine()}",
        "",
        "| case | baseline | ours | ratio | goal | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        lines.append(f"| {r.case} | {r.baseline} | {r.ours} | {ratio} | {r.goal} | {r.result} |")
    notes = [f"- {r.case}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))
