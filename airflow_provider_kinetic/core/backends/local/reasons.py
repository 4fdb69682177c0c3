"""Why a local job failed, from what its job dir holds.

A job's process can end three ways the status must tell apart (and a job dir can be
left without one, its submitter killed before starting it: ``unstarted``):

* its supervisor wrote an exit code: the runner's (or its interpreter's) code, or,
  negative, the signal that ended it (``Popen.returncode``): "killed by SIGKILL";
* its supervisor ended without writing one, after printing an error: it never got as
  far as running the job (the interpreter it was started with cannot import this
  package, say, while the DAG's process could through its own ``sys.path``);
* its supervisor ended without writing one or printing anything: a signal (SIGKILL,
  the OOM killer), the only way a Python process ends silently: "killed".

For a process that never reached the runner (the runner's log lines start with
``[kinetic-runner]``), the reason names the first error it printed (a traceback's
last line, Python's ``-m`` errors) and the interpreter it ran, so a user reads
"ModuleNotFoundError: No module named 'airflow_provider_kinetic'" instead of looking
for an OOM that never happened.  Only the head of the log is read, and the reason is
bounded (``REASON_MAX``) whatever was printed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

#: What every log line of the runner starts with (``runner.remote.main``): a log
#: that holds one ran the runner, so its supervisor and interpreter started.
RUNNER_MARK = "[kinetic-runner] "
#: How much of a log's head is searched (a start-up error comes first).
HEAD_BYTES = 64 * 1024
#: Longest reason (as the batch keeps, ``core.batch.state.REASON_MAX``), error and path.
REASON_MAX = 500
ERROR_MAX = 300
PATH_MAX = 150
#: The key in ``spec.json`` naming the interpreter that runs the supervisor (written
#: by ``LocalBackend.submit``).
PYTHON_KEY = "python"

_KILLED_SILENTLY = "process ended without an exit code and printed no error (killed)"
_TRACEBACK = "Traceback (most recent call last):"
#: ``python -m a.b`` when ``a`` is missing: "<exe>: Error while finding module
#: specification for 'a.b' (ModuleNotFoundError: No module named 'a')".
_MODULE_SPEC = re.compile(r"Error while finding module specification for .*?\((\w+: .*)\)\s*$")
#: "<exe>: No module named a" (``-m a``), "<exe>: can't open file ...".
_EXE_ERROR = re.compile(r"^\S+: ((?:No module named|can't open file) .*)$")
_FATAL = re.compile(r"^Fatal Python error: .+")


def unstarted(jdir: str, grace_s: float) -> str | None:
    """The reason for a job dir left without a ``pid`` for ``grace_s``, or None: its
    submitter died (SIGKILL) between making the dir and starting the supervisor, so
    the job will never start (a dir's mtime: the last file the submitter made in it)."""
    try:
        idle = time.time() - os.stat(jdir).st_mtime
    except FileNotFoundError:
        return None
    if idle < grace_s or os.path.exists(os.path.join(jdir, "pid")):
        return None
    return "never started: its submitter ended before starting it"


def exited(jdir: str, code: int) -> str:
    """The reason for a job whose supervisor wrote the nonzero exit code ``code``."""
    if code < 0:
        return killed_by(-code)
    reason = f"exit code {code}"
    error = startup_error(jdir)
    if error is None:
        return reason
    return _bounded(f"{reason} before the runner started: {error}", _spec(jdir, "runner"))


def vanished(jdir: str) -> str:
    """The reason for a job whose supervisor ended without writing an exit code."""
    error = startup_error(jdir)
    if error is None:
        return _KILLED_SILENTLY
    return _bounded(f"never started: {error}", _spec(jdir, "supervisor"))


def killed_by(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"killed by {name}"


def startup_error(jdir: str) -> str | None:
    """The first error the job's process printed before the runner started, or None
    (the runner started, or nothing that reads as an error was printed)."""
    try:
        with open(os.path.join(jdir, "log"), "rb") as f:
            head = f.read(HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    mark = head.find(RUNNER_MARK)
    if mark >= 0 and (mark == 0 or head[mark - 1] == "\n"):
        return None
    return first_error(head)


def first_error(text: str) -> str | None:
    """The first error in ``text``: a Python traceback's exception line, the errors
    the interpreter prints for ``-m`` and a missing script, or a fatal error."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(_TRACEBACK):
            for after in lines[i + 1 :]:
                if after.strip() and not after[0].isspace():
                    return after.strip()
            return None  # cut off mid-traceback: nothing certain to name
        found = _MODULE_SPEC.search(line) or _EXE_ERROR.match(line) or _FATAL.match(line)
        if found:
            return (found.group(1) if found.groups() else found.group(0)).strip()
    return None


def _spec(jdir: str, which: str) -> str | None:
    """The interpreter that ran the ``supervisor`` or the ``runner`` (``spec.json``)."""
    try:
        with open(os.path.join(jdir, "spec.json")) as f:
            spec = json.load(f)
    except (OSError, ValueError):
        return None
    if which == "supervisor":
        python = spec.get(PYTHON_KEY)
    else:
        argv = spec.get("argv") or [None]
        python = argv[0]
    return python if isinstance(python, str) else None


def _bounded(reason: str, python: str | None) -> str:
    head, sep, error = reason.partition(": ")
    reason = head + sep + _clip(error, ERROR_MAX)
    if python:
        reason += f" (interpreter {_clip(python, PATH_MAX)})"
    return _clip(reason, REASON_MAX)


def _clip(text: str, limit: int) -> str:
    """``text``, or its head and tail around an ellipsis, in ``limit`` characters."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3 :]
