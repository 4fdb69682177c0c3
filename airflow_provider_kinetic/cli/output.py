"""Printing rows: an aligned table for people, JSON for scripts; and keeping stdout
for that output alone.

Plain ``print`` rather than Airflow's rich console: the output must not depend on the
terminal width (rich wraps and truncates cells), so a script reading ``--output json``
or a person piping the table through ``grep`` gets every character.  For the same
reason nothing else may reach stdout while an action runs (:func:`stdout_for_output`):
a log line or warning before the JSON breaks ``json.loads`` and ``| jq``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO


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


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a file (a capture)
        return None


@contextlib.contextmanager
def _structlog_made_on_stderr() -> Iterator[None]:
    """structlog loggers made meanwhile write to stderr.

    Airflow's structlog logger factory leaves the stream open, so each logger takes
    ``sys.stdout`` when it is first used: every hook's ``self.log`` (the local-fallback
    warning) and, on Airflow 3.2+, ``py.warnings``, where ``warnings.showwarning``
    sends Python warnings.  Making them while ``sys.stdout`` is stderr sends them
    there, whatever factory Airflow (or nobody) configured.
    """
    try:
        import structlog
    except ImportError:  # no Airflow: nothing logs through structlog
        yield
        return
    factory = structlog.get_config()["logger_factory"]

    def made_on_stderr(*args: Any) -> Any:
        with contextlib.redirect_stdout(sys.stderr):
            return factory(*args)

    structlog.configure(logger_factory=made_on_stderr)
    try:
        yield
    finally:
        structlog.configure(logger_factory=factory)


def _handlers_to_stderr(stream: TextIO) -> None:
    """Logging handlers writing to ``stream`` (stdout) write to stderr from now on, as
    Airflow 3.2+ does for its own ``-o`` commands (3.1 and ``python -m`` do not)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setStream(sys.stderr)


@contextlib.contextmanager
def stdout_for_output() -> Iterator[None]:
    """While an action runs, only what it prints reaches stdout; logs go to stderr.

    Besides handlers and loggers made now, anything may already hold stdout's file
    descriptor: structlog loggers cached on first use, child processes, C code.  So
    descriptor 1 points at stderr meanwhile, and ``sys.stdout`` (what ``print``
    resolves at each call) is a new stream on the real stdout.  Where ``sys.stdout`` is
    not descriptor 1 (a test's capture), nothing else holds it: only loggers and
    handlers are moved.
    """
    original = sys.stdout
    with _structlog_made_on_stderr():
        _handlers_to_stderr(original)
        if _fileno(original) != 1 or _fileno(sys.stderr) is None:
            yield
            return
        original.flush()
        real = os.dup(1)
        try:
            os.dup2(sys.stderr.fileno(), 1)
            out = io.TextIOWrapper(
                io.FileIO(real, "w", closefd=False),
                encoding=original.encoding,
                errors=original.errors,
                line_buffering=original.line_buffering,
            )
            sys.stdout = out
            try:
                yield
            finally:
                sys.stdout = original
                out.flush()
        finally:
            original.flush()  # what was written to it meanwhile goes to stderr
            os.dup2(real, 1)
            os.close(real)
