"""Printing rows: an aligned table for people, JSON for scripts.

Plain ``print`` rather than Airflow's rich console: the output must not depend on the
terminal width (rich wraps and truncates cells), so a script reading ``--output json``
or a person piping the table through ``grep`` gets every character.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

FORMATS = ("table", "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if value == int(value) else f"{value:.1f}"
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Left-aligned columns under an upper-case header; ``(none)`` for no rows."""
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def emit(
    data: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    output: str,
    columns: Sequence[str] | None = None,
) -> None:
    """Print ``data`` (a list of rows, or one record shown as a two-column table)."""
    if output == "json":
        print(json.dumps(data, indent=2, default=str))
        return
    if isinstance(data, Mapping):
        rows = [{"field": k, "value": v} for k, v in data.items()]
        print(render_table(rows, ["field", "value"]))
        return
    print(render_table(data, columns))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
