"""The pod entry point: fetch the call, run it, write the result payload.

Runs in an image that has only ``cloudpickle`` and ``google-cloud-storage`` (plus
this package); it must never import Airflow.  Flags are kinetic 0.0.4's, so the
same Job spec works with kinetic's ``/app/remote_runner.py`` and with ours.
Every failure is written as a result payload naming its *phase*, and the process
exits 0 only when the function succeeded and its result was stored.

Here: :func:`main` and :func:`run` (what ``python -m airflow_provider_kinetic.runner``
and the image's ``remote_runner.py`` call), calling the function and writing its
signed result.  Beside it: the command line (``invocation.py``), the phases that
prepare the job's workspace (``workspace.py``), the attempt number and checkpoints
(``resume.py`` on ``checkpoint.py``) and the LeaderWorkerSet outcome markers
(``lws.py``), whose names this module re-exports.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

from airflow_provider_kinetic.core.jobs import progress_report
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.polling import STORE_OUTAGE_WINDOW_S
from airflow_provider_kinetic.core.jobs.progress import NOT_KEPT, PROGRESS_NAME, PROGRESS_URI_ENV
from airflow_provider_kinetic.core.jobs.signing import RESULT_KEY_ENV, sign, signature_key
from airflow_provider_kinetic.core.keys.joblocal import job_ended as peers_end
from airflow_provider_kinetic.core.spec.failure import USER_ERROR_EXIT, USER_PHASES
from airflow_provider_kinetic.core.storage import store_for_uri
from airflow_provider_kinetic.runner import debug
from airflow_provider_kinetic.runner.invocation import host_index, parse_args, slice_fields
from airflow_provider_kinetic.runner.lws import (
    FINISHED_FILE_ENV,
    LWS_ENV,
    idle_finished,
    lws_earlier_outcome,
    lws_record_outcome,
)
from airflow_provider_kinetic.runner.resume import Resume
from airflow_provider_kinetic.runner.workspace import (
    PhaseError,
    clean_up,
    prepare,
    resolve_refs,
)

__all__ = [
    "FINISHED_FILE_ENV",
    "LWS_ENV",
    "PhaseError",
    "host_index",
    "idle_finished",
    "lws_earlier_outcome",
    "lws_record_outcome",
    "main",
    "parse_args",
    "resolve_refs",
    "run",
]

log = logging.getLogger("kinetic.runner")

#: How long the runner waits for a local store that is away before writing its result.
OUTAGE_WINDOW_ENV = "KINETIC_STORE_OUTAGE_WINDOW_S"


def _execute(func: Any, args: tuple, kwargs: dict, index: int) -> dict[str, Any]:
    try:
        value = func(*args, **kwargs)
        return make_result(success=True, result=value, host_index=index)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return make_result(success=True, result=None, host_index=index)
        err = RuntimeError(f"function called sys.exit({exc.code})")
        code = exc.code if isinstance(exc.code, int) else 1  # as Python exits
        return make_result(
            success=False,
            exception=err,
            traceback=traceback.format_exc(),
            host_index=index,
            exit_code=code,
        )
    except BaseException as exc:  # noqa: BLE001
        err = exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")
        return make_result(
            success=False, exception=err, traceback=traceback.format_exc(), host_index=index
        )


def _result_uri(result_uri: str, index: int) -> str:
    if index == 0:
        return result_uri
    return result_uri.rsplit("/", 1)[0] + f"/result-worker-{index}.pkl"


def run(argv: list[str]) -> int:
    """Run one job; returns the process exit code.  The work dir (context, downloaded
    data) is removed whatever the outcome."""
    ns = parse_args(argv)
    # The job's own result key: taken out of the environment before user code runs.
    result_key = os.environ.pop(RESULT_KEY_ENV, None)
    workdir = tempfile.mkdtemp(prefix="kinetic-run-")
    links: list[tuple[str, str]] = []
    resume = Resume(ns.result_gcs, workdir, host_index())

    def cancelled(_signum: int, _frame: Any) -> None:
        # A cancel or GKE's preemption notice sends SIGTERM: save the checkpoints
        # (within the grace period), clean up and leave at once, writing no result
        # (the backend reports the job cancelled or preempted); Python's default would
        # skip both.  A second SIGTERM (the local backend signals the whole process
        # group) must not start it all again.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        resume.on_sigterm()
        peers_end()
        clean_up(workdir, links)
        os._exit(143)

    signal.signal(signal.SIGTERM, cancelled)
    try:
        return _run(ns, workdir, result_key, links, resume)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        peers_end()  # local keys end with the job; children finish reading first
        clean_up(workdir, links)


def _run(
    ns: argparse.Namespace,
    workdir: str,
    result_key: str | None,
    links: list[tuple[str, str]],
    resume: Resume,
) -> int:
    index = host_index()
    log.info("kinetic runner starting (host %d, pid %d)", index, os.getpid())
    try:
        resume.begin()  # before any download: the start record and the attempt number
        func, args, kwargs = prepare(ns, workdir, links)
        resume.restore()
        if debug.wanted() and index == 0:  # debug=True: a debugger attaches first
            try:
                debug.wait_for_client(ns.result_gcs.rsplit("/", 1)[0], workdir)
            except Exception as exc:  # noqa: BLE001 - the job fails naming why
                raise PhaseError(debug.PHASE, exc) from exc
        log.info(
            "calling %s (attempt %d)", getattr(func, "__qualname__", repr(func)), resume.attempt
        )
        # Where progress.update() writes (host 0: the job's; other hosts' are dropped).
        os.environ[PROGRESS_URI_ENV] = (
            ns.result_gcs.rsplit("/", 1)[0] + "/" + PROGRESS_NAME if index == 0 else NOT_KEPT
        )
        result = _execute(func, args, kwargs, index)
        progress_report.flush()  # the last update, always written
        resume.finish()
    except PhaseError as err:
        log.error("%s", err)
        result = make_result(
            success=False,
            exception=RuntimeError(str(err)),
            traceback="".join(traceback.format_exception(err.cause)),
            phase=err.phase,
            host_index=index,
        )
    if result["success"] and index != 0:
        log.info("worker %d succeeded; the leader owns the result", index)
        return 0
    result.update(slice_fields())  # a multi-slice job's failure names its slice
    blob, serialised = dump_result(result)
    ok = result["success"] and serialised
    uri = _result_uri(ns.result_gcs, index)
    if not result_key:
        log.warning("no result key in the environment: the result is not signed")
    try:
        _store_result(uri, blob, result_key)
    except Exception as exc:  # noqa: BLE001 - without a stored result the job must fail
        log.exception("could not store the result payload")
        _store_failure(uri, result_key, index, exc)
        return 1
    if not ok:
        log.error("function failed in phase %r", result["phase"])
        if result.get("traceback"):
            sys.stderr.write(result["traceback"])
    code = 0 if ok else 1
    if not ok and slice_fields() and result["phase"] in USER_PHASES:
        code = USER_ERROR_EXIT  # a multi-slice gang is not restarted for a user error
    log.info("result written; exiting %d", code)
    return code


def _store_result(uri: str, blob: bytes, result_key: str | None) -> None:
    """The payload, then its signature: each write is atomic (a temp name renamed into
    place, or one GCS object), and the data comes first, so a crash never leaves a
    signature without its data.  A local store that is away (its job dir missing: an
    unmounted store) is waited for, not written into a fresh empty root."""
    store, key = store_for_uri(uri)
    if store.scheme == "file":
        _await_local_store(os.path.dirname(os.sep + key))
    store.write_bytes(key, blob)
    if result_key:
        store.write_bytes(signature_key(key), sign(result_key, blob).encode())


def _await_local_store(job_dir: str) -> None:
    """Wait (up to ``KINETIC_STORE_OUTAGE_WINDOW_S``, default 600 s) for the job's dir
    in a local store, which the submit created: while it is missing the store is away,
    and writing would recreate its root empty and lose the result when it returns."""
    window = float(os.environ.get(OUTAGE_WINDOW_ENV) or STORE_OUTAGE_WINDOW_S)
    deadline = time.monotonic() + window
    if not os.path.isdir(job_dir):
        log.warning("the store is away (%s is missing): waiting up to %.0fs", job_dir, window)
    while not os.path.isdir(job_dir) and time.monotonic() < deadline:
        time.sleep(0.5)


def _store_failure(uri: str, result_key: str | None, index: int, exc: BaseException) -> None:
    """After the result could not be stored (a full disk, a quota): a small failure
    payload saying why, so the task's error names it (the partial write is gone, so it
    usually fits).  If it cannot be stored either, the job's log is all there is."""
    note = make_result(
        success=False,
        exception=RuntimeError(f"the job's result could not be stored: {exc}"),
        traceback=traceback.format_exc(),
        phase="store result",
        host_index=index,
    )
    try:
        _store_result(uri, dump_result(note)[0], result_key)
    except Exception:  # noqa: BLE001 - the log has the first error already
        log.exception("could not store the failure payload either")


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="[kinetic-runner] %(message)s", stream=sys.stderr
    )
    lws = os.environ.get(LWS_ENV) == "1"
    earlier = lws_earlier_outcome(sys.argv[1:]) if lws else None
    if earlier == "failed":
        log.error("a host of this job already failed: not running the function again")
        sys.exit(1)
    if earlier == "ok":
        idle_finished()
    code = run(sys.argv[1:])
    if lws:
        lws_record_outcome(sys.argv[1:], code)
        if code == 0:
            idle_finished()
    sys.stdout.flush()
    sys.stderr.flush()
    lingering = [
        t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
    ]
    if lingering:
        log.warning(
            "non-daemon threads still running (%s); exiting anyway",
            ", ".join(t.name for t in lingering),
        )
        os._exit(code)
    sys.exit(code)
