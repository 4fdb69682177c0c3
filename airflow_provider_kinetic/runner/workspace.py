"""Preparing one job's workspace: every phase before the function is called.

Fetches the payload and context (verifying their SHA-256 when given), installs the
requirements, extracts the context zip into the work dir (its plan sets ``sys.path``
and the cwd), unpickles the payload, checks its fingerprint, applies its env vars,
mounts its volumes and turns Data refs and result refs in the arguments into local
values (a local cache entry read in place is verified first, as a download is).  A
failure in any phase raises :class:`PhaseError` naming it, which the run
(``remote.py``) writes as the result payload.  :func:`clean_up` undoes it all.
Imports only what a pod has.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudpickle

from airflow_provider_kinetic.core.data import KEEP, is_data_ref, locallinks, map_leaves
from airflow_provider_kinetic.core.data.locallinks import LOCAL_MOUNTS_ENV
from airflow_provider_kinetic.core.data.refs import EMPTY_DIRS
from airflow_provider_kinetic.core.jobs.batchwire import select_input
from airflow_provider_kinetic.core.jobs.resultref import resolve_result_refs
from airflow_provider_kinetic.core.storage import file_uri_path, store_for_uri

log = logging.getLogger("kinetic.runner")

#: Data inputs downloaded at the same time (each one's own files in parallel too).
PREFETCH_REFS = 4


class PhaseError(Exception):
    """A setup failure, tagged with the phase it happened in."""

    def __init__(self, phase: str, cause: BaseException):
        super().__init__(f"kinetic {phase} failed: {type(cause).__name__}: {cause}")
        self.phase = phase
        self.cause = cause


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
    try:
        # Into this interpreter's environment (``--system`` would skip a venv and pick
        # another Python on PATH): the image's python3, or the venv the runner runs in.
        cmd = ["uv", "pip", "install", "--python", sys.executable, "-r", f.name]
        if shutil.which("uv") is None:  # an image without uv: pip
            cmd = [sys.executable, "-m", "pip", "install", "-r", f.name]
        subprocess.run(cmd, check=True)
    finally:
        os.unlink(f.name)


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
    (``gs://``/``file://``: a store download; ``hf://``: a datasets load).  A directory
    ref's path exists afterwards, with the empty directories its ref lists (the store
    holds files only), whatever the scheme."""
    # Imported here: the schemes (and the broadcast, built on them) bring the hashing
    # stack, which a call without Data refs never uses (~25 ms of every job's start).
    from airflow_provider_kinetic.core.data.schemes import scheme_for
    from airflow_provider_kinetic.core.data.schemes.base import create_empty_dirs
    from airflow_provider_kinetic.core.keys import databroadcast

    cast = databroadcast.wanted(ref)  # KineticMapOperator(broadcast=True): a tree
    if cast is not None:
        return databroadcast.get_data(ref, target, *cast)
    path = _local_view(ref, target) or scheme_for(ref["uri"]).materialise(ref, target)
    if ref.get("is_dir"):
        create_empty_dirs(ref, path)
    return path


def _local_view(ref: dict[str, Any], target: str) -> str | None:
    """Local backend: a ``file://`` cache entry is read in place, verified first: the
    entry itself, or a tree of links to its read-only files where the path must hold
    more (``core/data/localview.py``), instead of a copy;
    None where a copy is needed (not an entry, or a root job that cannot be kept
    from writing it)."""
    uri = ref["uri"].rstrip("/")
    if os.environ.get(LOCAL_MOUNTS_ENV) != "1" or not uri.startswith("file://"):
        return None
    from airflow_provider_kinetic.core.data import localview
    from airflow_provider_kinetic.core.data.schemes.download import expected_hash

    entry = file_uri_path(uri)
    if expected_hash(uri) is None or not os.path.isdir(entry) or localview.needs_copy():
        return None
    _verified(ref, f"Data({uri!r})", set())
    localview.seal(entry)
    is_dir = bool(ref.get("is_dir"))
    if not ref.get(EMPTY_DIRS) and not ref.get("mount_path") and localview.read_only_tree(entry):
        return localview.entry_path(entry, is_dir)  # the entry itself: nothing per job
    return localview.link_tree(entry, target, is_dir)


def _resolve_fuse(ref: dict[str, Any]) -> str:
    """A FUSE ref resolves to its mount path; a single file to that file there.

    A ``gs://`` file is mounted through its parent prefix, beside its siblings: it is
    the entry of its own name.  A local file's cache entry holds that one file under its
    local name.  Anything else is refused, never guessed (a sibling would be a silently
    wrong input)."""
    mount = ref["mount_path"]
    if ref.get("is_dir") or not os.path.isdir(mount):
        return mount
    named = os.path.join(mount, ref["uri"].rstrip("/").rsplit("/", 1)[-1])
    if os.path.isfile(named):
        return named
    entries = os.listdir(mount)
    if len(entries) == 1:
        return os.path.join(mount, entries[0])
    raise FileNotFoundError(
        f"Data({ref['uri']!r}, fuse=True): the file is not at {named} in its mount "
        f"({len(entries)} other entries there)"
    )


def _ref_key(ref: dict[str, Any]) -> str:
    """One download per URI and set of empty directories (trees differing only in
    empty directories share a cache entry, one URI)."""
    return f"{ref['uri']}\0{bool(ref.get('is_dir'))}\0{sorted(ref.get(EMPTY_DIRS) or ())}"


def prefetch_refs(objs: Any, workdir: str, cache: dict[str, str]) -> None:
    """Download every data ref in ``objs`` at once (each ref's own files in parallel
    too), so the function starts when the last input is complete rather than after
    the sum of them; the first failure is raised."""
    pending: dict[str, dict[str, Any]] = {}

    def collect(ref: Any) -> Any:
        if not is_data_ref(ref):
            return KEEP
        if not (ref.get("fuse") and ref.get("mount_path")):
            key = _ref_key(ref)
            if key not in cache and key not in pending:
                pending[key] = ref
        return ref

    map_leaves(objs, collect)
    if not pending:
        return
    targets = {
        key: ref.get("mount_path") or os.path.join(workdir, "data", str(len(cache) + n))
        for n, (key, ref) in enumerate(pending.items())
    }
    with ThreadPoolExecutor(max_workers=min(PREFETCH_REFS, len(pending))) as pool:
        futures = {
            key: pool.submit(_download_ref, ref, targets[key]) for key, ref in pending.items()
        }
        for key, fut in futures.items():
            cache[key] = fut.result()


def resolve_refs(
    obj: Any, workdir: str, cache: dict[str, str], verified: set[str] | None = None
) -> Any:
    """Replace ref dicts in args/kwargs with local paths (one download per URI and
    set of empty directories; ``prefetch_refs`` may have made them all already).
    ``verified``: the cache entries this job has verified (``_verified``)."""
    verified = set() if verified is None else verified

    def resolve(ref: Any) -> Any:
        if not is_data_ref(ref):
            return KEEP
        if ref.get("fuse") and ref.get("mount_path"):
            if _is_entry(ref):  # the cache entry itself (local backend): verified first
                _seal(_verified(ref, f"Data({ref['uri']!r}, fuse=True)", verified))
            return _resolve_fuse(ref)
        key = _ref_key(ref)
        if key not in cache:
            target = ref.get("mount_path") or os.path.join(workdir, "data", str(len(cache)))
            cache[key] = _download_ref(ref, target)
        return cache[key]

    return map_leaves(obj, resolve)


def _is_entry(ref: dict[str, Any]) -> bool:
    """Local backend: whether a FUSE ref's path is its ``file://`` cache entry itself
    (not a volume: a volume's link was verified when it was made)."""
    uri = ref["uri"].rstrip("/")
    return (
        os.environ.get(LOCAL_MOUNTS_ENV) == "1"
        and uri.startswith("file://")
        and os.path.normpath(ref["mount_path"]) == file_uri_path(uri)
    )


def _verified(ref: dict[str, Any], used: str, verified: set[str]) -> str:
    """The ref's local cache entry, read in place (no download checks it), once its
    content hashes to its name (once per job: ``verified``).  A bad or missing entry
    raises, naming it, and is removed (``core/data/schemes/entrycheck.py``)."""
    from airflow_provider_kinetic.core.data.schemes.entrycheck import verify_entry

    return verify_entry(ref["uri"], bool(ref.get("is_dir")), used, verified)


def _seal(entry: str) -> str:
    """A cache entry read in place, made read-only for a root job where it can be."""
    from airflow_provider_kinetic.core.data import localview

    localview.seal(entry)
    return entry


def _mount_volume(
    ref: dict[str, Any], workdir: str, n: int, links: list[tuple[str, str]], verified: set[str]
) -> None:
    """Put one volume at its mount path.

    In a pod: a FUSE volume is already mounted (CSI driver), others are downloaded into
    the mount path.  On the local backend the mount path is a host path: the volume
    becomes a link (shared by concurrent jobs, removed by the last) to the read-only
    cache entry, verified first, or to this job's own download in its work dir.
    """
    mount = ref["mount_path"]
    if os.environ.get(LOCAL_MOUNTS_ENV) != "1":
        if not ref.get("fuse"):
            _download_ref(ref, mount)
        return
    from airflow_provider_kinetic.core.data.schemes import scheme_for

    source = scheme_for(ref["uri"]).local_source(ref)
    if source is not None:  # the read-only cache entry itself
        source = _seal(_verified(ref, f"the volume at {mount}", verified))
    else:
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


def prepare(
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
        payload = cloudpickle.loads(payload_bytes)
        phase = "environment setup"
        _check_fingerprint(payload.get("client_fingerprint"))
        os.environ.update({k: str(v) for k, v in (payload.get("env_vars") or {}).items()})
        func, args, kwargs = payload["func"], payload.get("args", ()), payload.get("kwargs", {})
        if payload.get("batch_inputs"):
            phase = "batch input"
            func, args, kwargs = select_input(payload, _fetch)
        out = os.environ.get("KINETIC_OUTPUT_DIR", "")
        if out and "://" not in out:  # a local path (local backend): there before the call
            os.makedirs(out, exist_ok=True)
        phase = "data resolve"
        if os.environ.get(LOCAL_MOUNTS_ENV) == "1" and (
            payload.get("volumes") or payload.get("has_data_refs", True)
        ):  # before any thread: a root job's read-only view needs its own namespace
            from airflow_provider_kinetic.core.data import localview

            localview.needs_copy()
        cache: dict[str, str] = {}
        verified: set[str] = set()  # cache entries read in place, checked once each
        for n, ref in enumerate(payload.get("volumes") or []):
            _mount_volume(ref, workdir, n, links, verified)
        if payload.get("has_data_refs", True):
            prefetch_refs((args, kwargs), workdir, cache)
            args = resolve_refs(tuple(args), workdir, cache, verified)
            kwargs = resolve_refs(dict(kwargs), workdir, cache, verified)
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


def clean_up(workdir: str, links: list[tuple[str, str]]) -> None:
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
