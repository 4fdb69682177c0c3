"""The pod entry point: fetch the call, run it, write the result payload.

Runs in an image that has only ``cloudpickle`` and ``google-cloud-storage`` (plus
this package); it must never import Airflow.  Flags are kinetic 0.0.4's, so the
same Job spec works with kinetic's ``/app/remote_runner.py`` and with ours.
Every failure is written as a result payload naming its *phase*, and the process
exits 0 only when the function succeeded and its result was stored.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import zipfile
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core.data import KEEP, is_data_ref, locallinks, map_leaves
from airflow_provider_kinetic.core.data.locallinks import LOCAL_MOUNTS_ENV
from airflow_provider_kinetic.core.data.schemes import scheme_for
from airflow_provider_kinetic.core.jobs import unpickling
from airflow_provider_kinetic.core.jobs.batchwire import select_input
from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.resultref import resolve_result_refs
from airflow_provider_kinetic.core.jobs.signing import RESULT_KEY_ENV, sign, signature_key
from airflow_provider_kinetic.core.storage import store_for_uri

log = logging.getLogger("kinetic.runner")


class PhaseError(Exception):
    """A setup failure, tagged with the phase it happened in."""

    def __init__(self, phase: str, cause: BaseException):
        super().__init__(f"kinetic {phase} failed: {type(cause).__name__}: {cause}")
        self.phase = phase
        self.cause = cause


def parse_args(argv: list[str]) -> argparse.Namespace:
    """kinetic's flags; the legacy positional form and unknown flags are tolerated."""
    p = argparse.ArgumentParser(prog="airflow_provider_kinetic.runner")
    p.add_argument("--context-gcs")
    p.add_argument("--payload-gcs")
    p.add_argument("--result-gcs")
    p.add_argument("--requirements-gcs")
    p.add_argument("--payload-sha256")
    p.add_argument("--context-sha256")
    ns, rest = p.parse_known_args(argv)
    positional = [a for a in rest if not a.startswith("--")]
    for name, value in zip(
        ("context_gcs", "payload_gcs", "result_gcs", "requirements_gcs"), positional, strict=False
    ):
        if getattr(ns, name) is None:
            setattr(ns, name, value)
    missing = [f for f in ("context_gcs", "payload_gcs", "result_gcs") if not getattr(ns, f)]
    if missing:
        p.error("missing required flags: " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return ns


def host_index() -> int:
    """First non-negative integer in TPU_WORKER_ID, then LWS_WORKER_INDEX; else 0."""
    for var in ("TPU_WORKER_ID", "LWS_WORKER_INDEX"):
        m = re.search(r"\d+", os.environ.get(var, ""))
        if m:
            return int(m.group())
    return 0


def _fetch(uri: str) -> bytes:
    store, key = store_for_uri(uri)
    return store.read_bytes(key)


def _verify(name: str, data: bytes, expected: str | None) -> None:
    if expected and hashlib.sha256(data).hexdigest() != expected.lower():
        raise ValueError(
            f"{name} SHA-256 mismatch: expected {expected}, got {hashlib.sha256(data).hexdigest()}"
        )


def _install_requirements(uri: str) -> None:
    text = _fetch(uri).decode()
    if not text.strip():
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    # Into this interpreter's environment (``--system`` would skip a venv and pick
    # another Python on PATH): the image's python3, or the venv the runner runs in.
    cmd = ["uv", "pip", "install", "--python", sys.executable, "-r", f.name]
    if subprocess.call(["uv", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        cmd = [sys.executable, "-m", "pip", "install", "-r", f.name]
    subprocess.run(cmd, check=True)


def _extract_context(data: bytes, workdir: str) -> None:
    """Unpack context.zip into the workspace and apply its plan (sys.path, cwd)."""
    import io
    import json

    workspace = os.path.join(workdir, "workspace")
    os.makedirs(workspace, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            target = os.path.realpath(os.path.join(workspace, info.filename))
            if not target.startswith(os.path.realpath(workspace) + os.sep):
                raise ValueError(f"context.zip entry escapes the workspace: {info.filename!r}")
            zf.extract(info, workspace)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(target, mode)
    plan_path = os.path.join(workspace, ".kinetic", "plan.json")
    plan = {}
    if os.path.exists(plan_path):
        with open(plan_path) as f:
            plan = json.load(f)
    real = os.path.realpath(workspace)

    def inside(rel: str) -> str | None:  # a plan path that stays in the workspace
        path = os.path.realpath(os.path.join(workspace, rel))
        ok = (path == real or path.startswith(real + os.sep)) and os.path.isdir(path)
        return path if ok else None

    for rel in reversed(plan.get("sys_path_rel", [""])):
        if (path := inside(rel)) is not None:
            sys.path.insert(0, path)
    # The project root (plan "."): files next to the DAG open by relative path.
    cwd_rel = plan.get("client_cwd_rel")
    os.chdir(inside(cwd_rel) or real if cwd_rel else real)


def _download_ref(ref: dict[str, Any], target: str) -> str:
    """Materialise one data ref at ``target`` through the scheme its URI names
    (``gs://``/``file://``: a store download; ``hf://``: a datasets load)."""
    return scheme_for(ref["uri"]).materialise(ref, target)


def _resolve_fuse(ref: dict[str, Any]) -> str:
    """A FUSE ref resolves to its mount path; a single file to the one entry there."""
    mount = ref["mount_path"]
    if not ref.get("is_dir") and os.path.isdir(mount):
        entries = sorted(os.listdir(mount))
        if entries:
            return os.path.join(mount, entries[0])
    return mount


def resolve_refs(obj: Any, workdir: str, cache: dict[str, str]) -> Any:
    """Replace ref dicts in args/kwargs with local paths (one download per URI)."""

    def resolve(ref: Any) -> Any:
        if not is_data_ref(ref):
            return KEEP
        if ref.get("fuse") and ref.get("mount_path"):
            return _resolve_fuse(ref)
        if ref["uri"] not in cache:
            target = ref.get("mount_path") or os.path.join(workdir, "data", str(len(cache)))
            cache[ref["uri"]] = _download_ref(ref, target)
        return cache[ref["uri"]]

    return map_leaves(obj, resolve)


def _mount_volume(ref: dict[str, Any], workdir: str, n: int, links: list[tuple[str, str]]) -> None:
    """Put one volume at its mount path.

    In a pod: a FUSE volume is already mounted (CSI driver), others are downloaded into
    the mount path.  On the local backend the mount path is a host path: the volume
    becomes a link (shared by concurrent jobs, removed by the last) to the read-only
    cache entry, or to this job's own download in its work dir.
    """
    mount = ref["mount_path"]
    if os.environ.get(LOCAL_MOUNTS_ENV) != "1":
        if not ref.get("fuse"):
            _download_ref(ref, mount)
        return
    source = scheme_for(ref["uri"]).local_source(ref)
    if source is None:
        source = os.path.join(workdir, "volumes", str(n))
        _download_ref(ref, source)
    locallinks.acquire(mount, source)
    links.append((mount, source))


def _check_fingerprint(fp: dict[str, str] | None) -> None:
    if not fp:
        return
    import platform

    here = platform.python_version().rsplit(".", 1)[0]
    there = str(fp.get("python", "")).rsplit(".", 1)[0]
    if there and here != there:
        log.warning("payload pickled on Python %s, running on Python %s", there, here)
    if fp.get("cloudpickle") and fp["cloudpickle"] != cloudpickle.__version__:
        log.warning(
            "payload pickled with cloudpickle %s, running %s",
            fp["cloudpickle"],
            cloudpickle.__version__,
        )


def _setup(
    ns: argparse.Namespace, workdir: str, links: list[tuple[str, str]]
) -> tuple[Any, tuple, dict]:
    """Every phase before ``execute``; raises PhaseError naming the phase."""
    phase = "artifact download"
    try:
        payload_bytes = _fetch(ns.payload_gcs)
        context_bytes = _fetch(ns.context_gcs)
        phase = "artifact verification"
        _verify("payload", payload_bytes, ns.payload_sha256)
        _verify("context", context_bytes, ns.context_sha256)
        if ns.requirements_gcs:
            phase = "requirements install"
            _install_requirements(ns.requirements_gcs)
        phase = "context extract"
        _extract_context(context_bytes, workdir)
        phase = "payload unpickle"
        payload = unpickling.loads(payload_bytes)
        phase = "environment setup"
        _check_fingerprint(payload.get("client_fingerprint"))
        os.environ.update({k: str(v) for k, v in (payload.get("env_vars") or {}).items()})
        func, args, kwargs = payload["func"], payload.get("args", ()), payload.get("kwargs", {})
        if payload.get("batch_inputs"):
            phase = "batch input"
            func, args, kwargs = select_input(payload, _fetch)
        phase = "data resolve"
        cache: dict[str, str] = {}
        for n, ref in enumerate(payload.get("volumes") or []):
            _mount_volume(ref, workdir, n, links)
        if payload.get("has_data_refs", True):
            args = resolve_refs(tuple(args), workdir, cache)
            kwargs = resolve_refs(dict(kwargs), workdir, cache)
        phase = "result reference resolve"  # upstream results that did not fit XCom
        loaded: dict[str, Any] = {}
        args = resolve_result_refs(tuple(args), loaded)
        kwargs = resolve_result_refs(dict(kwargs), loaded)
        if loaded:
            log.info("loaded %d upstream result(s) passed by reference", len(loaded))
        return func, args, kwargs
    except PhaseError:
        raise
    except BaseException as exc:  # noqa: BLE001 - every setup failure becomes a payload
        raise PhaseError(phase, exc) from exc


def _execute(func: Any, args: tuple, kwargs: dict, index: int) -> dict[str, Any]:
    try:
        value = func(*args, **kwargs)
        return make_result(success=True, result=value, host_index=index)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return make_result(success=True, result=None, host_index=index)
        err = RuntimeError(f"function called sys.exit({exc.code})")
        return make_result(
            success=False, exception=err, traceback=traceback.format_exc(), host_index=index
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

    def cancelled(_signum: int, _frame: Any) -> None:
        # A cancel sends SIGTERM: clean up and leave at once, writing no result (the
        # backend reports the job cancelled); Python's default would skip the cleanup.
        _clean_up(workdir, links)
        os._exit(143)

    signal.signal(signal.SIGTERM, cancelled)
    try:
        return _run(ns, workdir, result_key, links)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _clean_up(workdir, links)


def _clean_up(workdir: str, links: list[tuple[str, str]]) -> None:
    """Remove the work dir and this job's uses of volume links (local backend)."""
    for mount, source in links:
        try:
            locallinks.release(mount, source)
        except OSError as exc:
            log.warning("could not remove the volume link %s: %s", mount, exc)
    links.clear()
    with contextlib.suppress(OSError):
        os.chdir(tempfile.gettempdir())  # the work dir may be the cwd (context plan)
    shutil.rmtree(workdir, ignore_errors=True)


def _run(
    ns: argparse.Namespace, workdir: str, result_key: str | None, links: list[tuple[str, str]]
) -> int:
    index = host_index()
    log.info("kinetic runner starting (host %d, pid %d)", index, os.getpid())
    try:
        func, args, kwargs = _setup(ns, workdir, links)
        log.info("calling %s", getattr(func, "__qualname__", repr(func)))
        result = _execute(func, args, kwargs, index)
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
    blob, serialised = dump_result(result)
    ok = result["success"] and serialised
    try:
        store, key = store_for_uri(_result_uri(ns.result_gcs, index))
        if result_key:  # the signature first: whoever sees the result can verify it
            store.write_bytes(signature_key(key), sign(result_key, blob).encode())
        else:
            log.warning("no result key in the environment: the result is not signed")
        store.write_bytes(key, blob)
    except Exception:  # noqa: BLE001 - without a stored result the job must fail
        log.exception("could not store the result payload")
        return 1
    if not ok:
        log.error("function failed in phase %r", result["phase"])
        if result.get("traceback"):
            sys.stderr.write(result["traceback"])
    log.info("result written; exiting %d", 0 if ok else 1)
    return 0 if ok else 1


# ---- LeaderWorkerSet hosts: finish once, never run again ---------------------------
LWS_ENV = "KINETIC_LWS"
#: manifests.FINISHED_FILE, the readiness probe's file (tests point it elsewhere).
FINISHED_FILE_ENV = "KINETIC_FINISHED_FILE"


def _markers(argv: list[str]) -> tuple[Any, str]:
    """The job's store and the key prefix of its per-host finish markers."""
    store, key = store_for_uri(parse_args(argv).result_gcs)
    return store, key.rsplit("/", 1)[0] + "/finished-"


def lws_earlier_outcome(argv: list[str]) -> str | None:
    """``"failed"`` when any host of this job already failed, ``"ok"`` when this host
    already succeeded, else None (a first start, or a restart before finishing)."""
    store, prefix = _markers(argv)
    names = store.list(prefix)
    if any(n.endswith("-failed") for n in names):
        return "failed"
    return "ok" if f"{prefix}{host_index()}-ok" in names else None


def lws_record_outcome(argv: list[str], code: int) -> None:
    store, prefix = _markers(argv)
    store.write_bytes(f"{prefix}{host_index()}-{'ok' if code == 0 else 'failed'}", b"")


def idle_finished() -> None:
    """Signal completion (readiness probe) and stay up until the job is deleted."""
    with open(os.environ.get(FINISHED_FILE_ENV, "/tmp/kinetic-finished"), "w") as f:
        f.write("0")
    log.info("finished; idling so the LeaderWorkerSet does not restart this host")
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        signal.pause()


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
