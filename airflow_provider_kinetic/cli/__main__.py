"""``python -m airflow_provider_kinetic.cli jobs list ...``: the ``airflow kinetic``
commands without going through Airflow's CLI (which lists providers, and so only sees
this group once the provider's ``cli`` entry is installed).

The parser is built from the very definitions Airflow uses (``Arg.add_to_parser``),
so both entry points accept the same flags.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from airflow_provider_kinetic.cli import get_kinetic_cli_commands


def _add(subparsers: Any, command: Any) -> None:
    parser = subparsers.add_parser(command.name, help=command.help, description=command.help)
    if hasattr(command, "subcommands"):  # GroupCommand
        nested = parser.add_subparsers(dest=f"{command.name}_command", metavar="COMMAND")
        nested.required = True
        for sub in command.subcommands:
            _add(nested, sub)
        return
    for arg in command.args:
        arg.add_to_parser(parser)
    parser.set_defaults(func=command.func)


def build_parser() -> argparse.ArgumentParser:
    """``kinetic``'s subcommands at the top level (``jobs``, ``data``, ``accelerators``)."""
    (group,) = get_kinetic_cli_commands()
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_kinetic.cli", description=group.help
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for sub in group.subcommands:
        _add(commands, sub)
    return parser


def _stdout_log_handlers_to_stderr() -> None:
    """Airflow's own helper where it has one (3.2+); on 3.1 the same, here."""
    try:
        from airflow.cli.utils import redirect_stdout_log_handlers_to_stderr
    except ImportError:  # Airflow 3.1
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(sys.stderr)
        return
    redirect_stdout_log_handlers_to_stderr()


def main(argv: Sequence[str] | None = None) -> None:
    # Importing Airflow configures logging (and may log) on stdout; keep stdout for
    # the output alone (``-o json | jq``), as ``airflow`` does for ``--output`` commands.
    with contextlib.redirect_stdout(sys.stderr):
        parser = build_parser()
        _stdout_log_handlers_to_stderr()
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
