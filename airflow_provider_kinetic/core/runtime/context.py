"""The job context: the DAG's project directory, zipped once per content.

A function that opens ``assets/labels.txt`` next to its DAG must find it in the pod
too, so the job gets a snapshot of the DAG file's *project directory* (kinetic's
package-root rules), not only the pickled function.  The snapshot is deterministic
(sorted entries, fixed timestamps and modes), so the same files give the same bytes
and the same SHA-256; that hash names a content-addressed object in the store
(``default/context-cache/{sha256}.zip``), uploaded once and shared by every job and
batch child with that content.  Objects are written atomically (a reader never sees
a partial one), so an existing object is a complete one and a hit uploads nothing.

Why the size cap is an error and not kinetic's warning: the zip is built in memory on
the Airflow worker for every task; a stray dataset in the DAG folder would otherwise
be re-read, re-zipped and uploaded silently.  The error names the largest files and
both ways to leave them out (``.kineticignore``, ``context_excludes=``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import stat
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.base import PreconditionFailed

log = logging.getLogger(__name__)

#: Any of these in a directory makes it a project root (kinetic's markers).
ROOT_MARKERS = ("pyproject.toml", "requirements.txt", "setup.py", "setup.cfg", ".git")
#: Never archived: version control and bytecode are not part of a job.
ALWAYS_EXCLUDED_DIRS = frozenset({".git", "__pycache__"})
#: Excluded unless ``KINETIC_NO_DEFAULT_EXCLUDES=1`` (environments, tool caches).
DEFAULT_EXCLUDED_DIRS = frozenset(
    {
        ".venv",
        "venv",
        "node_modules",
        ".tox",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".ipynb_checkpoints",
    }
)
DEFAULT_EXCLUDED_FILES = frozenset({".DS_Store"})
IGNORE_FILE = ".kineticignore"
PLAN_PATH = ".kinetic/plan.json"
CONTEXT_CACHE = "default/context-cache"
DEFAULT_MAX_CONTEXT_MB = 100.0
PACKAGE_ROOT_ENV = "KINETIC_PACKAGE_ROOT"
NO_DEFAULT_EXCLUDES_ENV = "KINETIC_NO_DEFAULT_EXCLUDES"
#: Zip's earliest representable time: every entry gets it, so bytes depend on content only.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SENSITIVE = (".env*", "*.pem", "id_rsa*")


class ContextError(KineticError, ValueError):
    """The job context cannot be built (bad entry file, root or exclude pattern)."""


class ContextTooLargeError(ContextError):
    """The project directory is over the size cap; names the largest files."""


@dataclass(frozen=True)
class JobContext:
    """A built context: the zip bytes, their hash and what went in."""

    data: bytes
    sha256: str
    root: str
    files: int
    total_bytes: int

    @property
    def key(self) -> str:
        """The content-addressed store key every job with this content shares."""
        return context_key(self.sha256)


def context_key(sha256: str) -> str:
    return f"{CONTEXT_CACHE}/{sha256}.zip"


# ---- the package root ---------------------------------------------------------------


def find_package_root(entry_dir: str, home: str | None = None, ceilings: Iterable[str] = ()) -> str:
    """kinetic's package root of ``entry_dir``.

    Climb while the directory is a package (``__init__.py``), then to the nearest
    directory holding a project marker; ``$HOME`` and ``/`` are adopted only when the
    walk starts there; no marker keeps the directory the package climb ended at.
    ``KINETIC_PACKAGE_ROOT`` replaces detection (it must contain the entry directory).

    ``ceilings`` (the DAGs folder): the walk never leaves one that holds the DAG, so a
    marker above it (``requirements.txt`` in ``$AIRFLOW_HOME``) cannot pull in the
    whole Airflow home with its logs.
    """
    entry_dir = os.path.realpath(entry_dir)
    override = os.environ.get(PACKAGE_ROOT_ENV)
    if override:
        root = os.path.realpath(override)
        if not os.path.isdir(root) or not _contains(root, entry_dir):
            raise ContextError(
                f"{PACKAGE_ROOT_ENV}={override!r} must be an existing directory containing "
                f"the DAG's directory {entry_dir!r}"
            )
        return root
    home = os.path.realpath(home or os.path.expanduser("~"))
    never = {home, os.path.realpath(os.sep)}  # adopted only when the walk starts there
    tops = {c for c in map(os.path.realpath, filter(None, ceilings)) if _contains(c, entry_dir)}
    current = entry_dir
    while current not in never | tops and os.path.isfile(os.path.join(current, "__init__.py")):
        parent = os.path.dirname(current)
        if parent in never or parent == current:
            break
        current = parent
    probe = current
    while True:
        adoptable = probe not in never or probe == entry_dir
        if adoptable and any(os.path.exists(os.path.join(probe, m)) for m in ROOT_MARKERS):
            return probe
        parent = os.path.dirname(probe)
        if probe in never | tops or parent == probe:
            return current
        probe = parent


def _contains(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# ---- what goes in -------------------------------------------------------------------


def read_ignore_file(root: str) -> list[str]:
    """Patterns of ``{root}/.kineticignore`` (blank lines and ``#`` comments skipped)."""
    path = os.path.join(root, IGNORE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def check_patterns(patterns: object, source: str = "context_excludes") -> list[str]:
    """``patterns`` as a list of non-empty glob strings (one string is one pattern), else
    a :class:`ContextError` naming ``source``."""
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, Iterable) or isinstance(patterns, bytes | dict):
        raise ContextError(f"{source} must be a list of glob patterns, got {patterns!r}")
    out = list(patterns)
    bad = [p for p in out if not isinstance(p, str) or not p.strip()]
    if bad:
        raise ContextError(f"{source} entries must be non-empty glob strings, got {bad[0]!r}")
    return out


def _matches(rel: str, is_dir: bool, patterns: Sequence[str]) -> bool:
    """gitignore-like: trailing ``/`` = directories only, leading ``/`` ignored; a pattern
    matches the path relative to the root or the entry's own name."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dirs_only = pattern.endswith("/")
        pat = pattern.strip("/") if dirs_only else pattern.lstrip("/")
        if dirs_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(name, pat):
            return True
    return False


@dataclass(frozen=True)
class _Entry:
    rel: str
    path: str
    size: int
    executable: bool


def collect(
    root: str, patterns: Sequence[str], skip: Iterable[str] = ()
) -> tuple[list[_Entry], list[str]]:
    """The files (sorted by relative path) and empty directories to archive.

    Directory symlinks are followed with a (device, inode) cycle guard; broken links,
    special files and unreadable files are skipped with a warning.  ``skip``: absolute
    paths left out (Data inside the project travels through the data cache instead).
    """
    defaults = os.environ.get(NO_DEFAULT_EXCLUDES_ENV) != "1"
    skipped = {os.path.realpath(p) for p in skip}
    files: list[_Entry] = []
    empty: list[str] = []
    seen: set[tuple[int, int]] = set()

    def visit(path: str, rel: str) -> None:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) in seen:
            log.warning("context: %s is a directory link cycle; skipped", path)
            return
        seen.add((st.st_dev, st.st_ino))
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            log.warning("context: cannot list %s (%s); skipped", path, exc)
            return
        kept = 0
        for name in names:
            full, sub = os.path.join(path, name), f"{rel}{name}"
            try:
                st = os.stat(full)
            except OSError:
                log.warning("context: %s is a broken link or unreadable; skipped", full)
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if _excluded(sub, name, is_dir, patterns, defaults) or (
                skipped and os.path.realpath(full) in skipped
            ):
                continue
            if is_dir:
                kept += 1
                visit(full, sub + "/")
            elif stat.S_ISREG(st.st_mode) and os.access(full, os.R_OK):
                kept += 1
                files.append(_Entry(sub, full, st.st_size, bool(st.st_mode & 0o111)))
                if any(fnmatch.fnmatchcase(name, p) for p in _SENSITIVE):
                    log.warning("context: %s looks like a secret and is archived", sub)
            else:
                log.warning("context: %s is not a readable regular file; skipped", full)
        if not kept and rel:
            empty.append(rel)

    visit(root, "")
    files.sort(key=lambda e: e.rel)
    return files, sorted(empty)


def _excluded(rel: str, name: str, is_dir: bool, patterns: Sequence[str], defaults: bool) -> bool:
    if is_dir and name in ALWAYS_EXCLUDED_DIRS:
        return True
    if defaults and (
        (is_dir and name in DEFAULT_EXCLUDED_DIRS)
        or (not is_dir and name in DEFAULT_EXCLUDED_FILES)
    ):
        return True
    return _matches(rel, is_dir, patterns)


# ---- the archive --------------------------------------------------------------------


def plan_for(root: str, entry_dir: str) -> dict[str, object]:
    """kinetic's ``.kinetic/plan.json``: the root (and the DAG's directory) go on
    ``sys.path`` and the function runs with the project root as its working dir."""
    entry_rel = os.path.relpath(entry_dir, root).replace(os.sep, "/")
    sys_path = [""] if entry_rel == "." else ["", entry_rel]
    return {
        "package_root": root,
        "entry_rel": entry_rel,
        "client_cwd_rel": ".",
        "sys_path_rel": sys_path,
    }


def _info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.create_system = 3  # Unix: the runner restores the mode bits
    info.external_attr = mode << 16
    if name.endswith("/"):
        info.external_attr |= 0x10  # MS-DOS directory flag
    else:
        info.compress_type = zipfile.ZIP_DEFLATED
    return info


def archive(files: Sequence[_Entry], empty_dirs: Sequence[str], plan: dict[str, object]) -> bytes:
    """The deterministic zip: sorted entries, fixed times, modes 0644/0755 only."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(_info(PLAN_PATH, 0o100644), json.dumps(plan, indent=2, sort_keys=True))
        entries = [(e.rel, e) for e in files] + [(d, None) for d in empty_dirs]
        for name, entry in sorted(entries, key=lambda x: x[0]):
            if entry is None:
                zf.writestr(_info(name, 0o40755), b"")
                continue
            with open(entry.path, "rb") as src:
                data = src.read()
            zf.writestr(_info(name, 0o100755 if entry.executable else 0o100644), data)
    return buf.getvalue()


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _too_large(root: str, files: Sequence[_Entry], total: int, max_mb: float) -> None:
    largest = sorted(files, key=lambda e: (-e.size, e.rel))[:5]
    listing = "; ".join(f"{e.rel} ({_human(e.size)})" for e in largest)
    top = largest[0].rel
    example = top.split("/")[0] + "/" if "/" in top else top
    raise ContextTooLargeError(
        f"the job context (the DAG's project directory {root}) is {_human(total)}, over "
        f"the {max_mb:g} MB cap ([kinetic] max_context_mb). Largest files: {listing}. "
        f"Leave them out with a pattern per line in {os.path.join(root, IGNORE_FILE)} "
        f"(e.g. {example!r}) or the operator's context_excludes=[...], and pass data "
        "with Data(...) instead"
    )


def build_context(
    entry_file: str,
    *,
    excludes: Sequence[str] = (),
    max_mb: float | None = None,
    skip: Iterable[str] = (),
    ceilings: Iterable[str] = (),
) -> JobContext:
    """Zip the project directory of ``entry_file`` (the DAG file); uploads nothing.

    Raises :class:`ContextError` for a missing entry file or bad patterns and
    :class:`ContextTooLargeError` over ``max_mb`` (default 100), before reading files.
    """
    patterns = check_patterns(excludes)
    if not isinstance(entry_file, str) or not os.path.isfile(entry_file):
        raise ContextError(f"the DAG file {entry_file!r} does not exist: no job context to build")
    entry_dir = os.path.dirname(os.path.realpath(entry_file))
    root = find_package_root(entry_dir, ceilings=ceilings)
    patterns = read_ignore_file(root) + patterns
    files, empty = collect(root, patterns, skip)
    total = sum(e.size for e in files)
    cap = DEFAULT_MAX_CONTEXT_MB if max_mb is None else float(max_mb)
    if cap > 0 and total > cap * 1024 * 1024:
        _too_large(root, files, total, cap)
    data = archive(files, empty, plan_for(root, entry_dir))
    log.info("job context: %s, %d file(s), %s", root, len(files), _human(total))
    return JobContext(data, hashlib.sha256(data).hexdigest(), root, len(files), total)


def minimal_context() -> bytes:
    """A plan-only context (no DAG file known): the code travels in the payload."""
    plan = {"package_root": "/", "entry_rel": ".", "client_cwd_rel": None, "sys_path_rel": [""]}
    return archive([], [], plan)


# ---- the store ----------------------------------------------------------------------


def upload_context(store: ObjectStore, data: bytes, sha256: str | None = None) -> bool:
    """Ensure the context is in the store's cache; True when this call uploaded it.

    Objects are written atomically, so one that exists is complete: a hit writes
    nothing.  Two submitters racing both skip or one wins (``if_absent``).
    """
    digest = sha256 or hashlib.sha256(data).hexdigest()
    key = context_key(digest)
    if store.exists(key):
        log.info("job context %s already in the store: nothing to upload", digest[:12])
        return False
    try:
        store.write_bytes(key, data, content_type="application/zip", if_absent=True)
    except PreconditionFailed:
        return False
    restrict = getattr(store, "make_private", None)
    if restrict is not None:
        restrict(key)
    log.info("uploaded job context %s (%s) -> %s", digest[:12], _human(len(data)), store.uri(key))
    return True
