"""What every ``airflow kinetic ...`` action shares: one-line errors, the output format
and a stdout that carries the output alone.

Each action takes the parsed argparse namespace and is wrapped in :func:`command`, so
every failure a person can fix ends as one ``error: ...`` line on stderr and exit
code 1, never a traceback, and whatever logs or warns while it runs (the hook's
local-fallback warning, Airflow's log lines, Python warnings) goes to stderr, so
``-o json`` parses whichever entry point ran it.  Kept apart from the actions
(``jobs``, ``data``, ``catalog``) so they share it without importing one another, and
light: it imports no backend, hook or Airflow module.
"""

from __future__ import annotations

import functools
import sys
from argparse import Namespace
from collections.abc import Callable

from airflow_provider_kinetic.cli.output import stdout_for_output
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectNotFound


class CliError(Exception):
    """A failure reported as one line, without a traceback."""


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def command(func: Callable[[Namespace], None]) -> Callable[[Namespace], None]:
    """Turn the errors a person can act on into ``error: ...`` and exit code 1, with
    only the action's output on stdout."""

    @functools.wraps(func)
    def run(args: Namespace) -> None:
        with stdout_for_output():
            try:
                func(args)
            except (CliError, KineticError, ValueError, ObjectNotFound) as exc:
                _fail(str(exc))

    return run


def output_format(args: Namespace) -> str:
    """``--output`` (``table`` or ``json``); ``table`` where the command has none."""
    return getattr(args, "output", "table") or "table"
