"""A job's Python requirements: given, or discovered next to the DAG file; then filtered.

``requirements=`` is a list of requirement lines, a path to a requirements file
(relative paths are relative to the DAG file's directory), or absent.  Absent means
discovery with kinetic's rules: walk up from the directory of the entry file (the DAG
file); at each level ``requirements.txt`` beats ``pyproject.toml`` (whose
``[project].dependencies`` are read); stop after the first directory holding ``.git``,
at ``$HOME`` or at ``/``.  An empty list means "none" (no discovery).

What reaches a pod is filtered:

* the JAX packages (``jax``, ``jaxlib``, ``libtpu``, ``libtpu-nightly``, by PEP 503
  name) are dropped with a warning, because the image installs the JAX build that
  matches the accelerator (a CPU ``jax`` pin would replace the TPU/CUDA build);
  a line with ``# kn:keep`` stays;
* lines that cannot work on a pod (a local ``-e``, ``-r``/``-c`` includes, ``file://``,
  ``./``, ``../``, absolute paths, ``pkg @ ./path``) are refused with an error naming
  the line, *before* anything is uploaded or built.  kinetic refuses these in its
  prebuilt mode only; a bundled build fails on them just the same, minutes later, so
  both remote modes refuse them here.  Backslash continuations are joined first.

The local backend gets the lines unfiltered (its venv is on this machine, where
local paths resolve).  The hash is over the filtered lines, so comment-only edits
of a kept line still change it (they are part of what is installed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError

log = logging.getLogger(__name__)

#: Packages the image provides per accelerator category.
JAX_PACKAGES = frozenset({"jax", "jaxlib", "libtpu", "libtpu-nightly"})
KEEP_MARKER = re.compile(r"#\s*kn:keep\b")
#: Where requirements end up: ``local`` (this machine) or a remote image mode.
MODES = ("local", "bundled", "prebuilt", "custom")
_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_URL_AT = re.compile(r"@\s*(\S+)")


class RequirementsError(KineticError, ValueError):
    """Requirements that cannot be used; the message names the line and the rule."""


@dataclass(frozen=True)
class Requirements:
    """Filtered requirement lines, where they came from, and their hash."""

    lines: list[str] = field(default_factory=list)
    #: a file path, ``"requirements="`` for an inline list, or ``None`` (none found)
    source: str | None = None

    @property
    def text(self) -> str:
        """The lines as a requirements file (what is uploaded / copied into a build)."""
        return "".join(line + "\n" for line in self.lines)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def installable(self) -> list[str]:
        """Lines that install something (no blank/comment-only lines)."""
        return [ln for ln in self.lines if ln.split("#", 1)[0].strip()]


def normalise_name(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    """The normalised project name a requirement line installs, or ``None``
    (blank, comment, option line, URL or path)."""
    body = line.split("#", 1)[0].strip()
    if not body or body.startswith("-") or "://" in body.split("@", 1)[0]:
        return None
    m = _NAME.match(body)
    return normalise_name(m.group(1)) if m else None


def find_requirements(
    entry_dir: str, home: str | None = None, ceilings: Iterable[str] = ()
) -> str | None:
    """The requirements file kinetic would use for code in ``entry_dir`` (or None).

    ``ceilings`` (the DAGs folder): the walk never leaves one that holds the DAG, as
    the job context does not (``runtime.context``): a ``pyproject.toml`` above the
    DAGs folder (Airflow's own deployment, this repository) is not the DAG's project.
    """
    home = os.path.realpath(home or os.path.expanduser("~"))
    here = os.path.realpath(entry_dir)
    tops = {
        top
        for top in map(os.path.realpath, filter(None, ceilings))
        if here == top or here.startswith(top.rstrip(os.sep) + os.sep)
    }
    while True:
        for name in ("requirements.txt", "pyproject.toml"):
            candidate = os.path.join(here, name)
            if os.path.isfile(candidate):
                return candidate
        parent = os.path.dirname(here)
        if os.path.exists(os.path.join(here, ".git")) or here in (home, parent) or here in tops:
            return None
        here = parent


def pyproject_dependencies(path: str) -> list[str]:
    """``[project].dependencies`` of a pyproject; warns where kinetic would not look."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise RequirementsError(f"{path} is not valid TOML: {exc}") from None
    project = data.get("project") or {}
    deps = project.get("dependencies") or []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise RequirementsError(f"{path}: [project].dependencies must be a list of strings")
    ignored = []
    if "dependencies" in (project.get("dynamic") or []):
        ignored.append("dynamic dependencies")
    if project.get("optional-dependencies"):
        ignored.append("[project.optional-dependencies]")
    if data.get("dependency-groups"):
        ignored.append("[dependency-groups]")
    if (data.get("tool") or {}).get("poetry", {}).get("dependencies"):
        ignored.append("[tool.poetry.dependencies]")
    if ignored:
        log.warning(
            "%s: only [project].dependencies are installed; ignoring %s",
            path,
            ", ".join(ignored),
        )
    return list(deps)


def read_lines(path: str) -> list[str]:
    """Requirement lines of a requirements file or a pyproject."""
    if os.path.basename(path) == "pyproject.toml":
        return pyproject_dependencies(path)
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def join_continuations(lines: Sequence[str]) -> list[str]:
    """Backslash-continued physical lines joined into logical lines."""
    out: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending.rstrip())
    return out


def filter_jax(lines: Sequence[str], category: str) -> list[str]:
    """Drop JAX packages (the image installs JAX for ``category``) unless kept."""
    out = []
    for line in lines:
        name = requirement_name(line)
        if name in JAX_PACKAGES and not KEEP_MARKER.search(line):
            log.warning(
                "requirements: dropping %r: the %s image installs its own JAX build "
                "(add '# kn:keep' to the line to install it anyway)",
                line.strip(),
                category,
            )
            continue
        out.append(line)
    return out


def remote_problem(line: str) -> str | None:
    """Why ``line`` cannot be installed on a pod, or ``None``."""
    body = line.split(" #", 1)[0].strip()
    if body.startswith("#") or not body:
        return None
    first, _, rest = body.partition(" ")
    if first in ("-r", "--requirement", "-c", "--constraint") or first.startswith(
        ("-r", "-c", "--requirement=", "--constraint=")
    ):
        return "it includes another file, which is not sent to the pod"
    target = body
    if first in ("-e", "--editable"):
        target = rest.strip()
    elif first.startswith("--editable="):
        target = first.split("=", 1)[1]
    elif first in ("-f", "--find-links"):
        target = rest.strip()
    elif first.startswith("-"):
        return None  # --index-url, --extra-index-url, --find-links <url>, ...
    at = _URL_AT.search(target)
    if at:
        target = at.group(1)
    if target.startswith("file:"):
        return "a file:// URL points at this machine"
    if target.startswith(("./", "../", ".\\", "..\\", "~")) or target in (".", ".."):
        return "a relative path points at this machine"
    if os.path.isabs(target) or re.match(r"^[A-Za-z]:[\\/]", target):
        return "an absolute path points at this machine"
    editable = first in ("-e", "--editable") or first.startswith("--editable=")
    if editable and "://" not in target and not target.startswith("git+"):
        return "an editable install of a local directory"
    return None


def check_remote(lines: Sequence[str], source: str | None) -> None:
    """Raise for the first line a pod cannot install (before any upload or build)."""
    for line in lines:
        problem = remote_problem(line)
        if problem:
            where = f" in {source}" if source else ""
            raise RequirementsError(
                f"requirement {line.strip()!r}{where} cannot be installed in the job's "
                f"image: {problem}. Allowed: named requirements (pkg==1.0), VCS or https "
                "URLs (pkg @ https://...), and index options; put local packages in a "
                "custom container_image"
            )


def check_spec(spec: Any) -> Any:
    """``spec`` if it is a usable ``requirements=`` value (type only; files are read
    when the task runs), else an error naming it."""
    if spec is None or isinstance(spec, str | os.PathLike):
        return spec
    if isinstance(spec, list | tuple) and all(isinstance(s, str) for s in spec):
        return spec
    bad = spec
    if isinstance(spec, list | tuple):
        bad = next(s for s in spec if not isinstance(s, str))
    raise RequirementsError(
        f"requirements: {bad!r} ({type(bad).__name__}) is not allowed; give a list of "
        "requirement strings, a path to a requirements file, or nothing (discovery)"
    )


def load_spec(
    spec: Any, entry_file: str | None, ceilings: Iterable[str] = ()
) -> tuple[list[str], str | None]:
    """(raw lines, source) of a ``requirements=`` value (see module docstring)."""
    if spec is None:
        if not entry_file:
            return [], None
        entry_dir = os.path.dirname(os.path.abspath(entry_file))
        found = find_requirements(entry_dir, ceilings=ceilings)
        return (read_lines(found), found) if found else ([], None)
    check_spec(spec)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, str):
        path = os.path.expanduser(spec)
        if not os.path.isabs(path) and entry_file:  # relative to the DAG file, not the cwd
            path = os.path.join(os.path.dirname(os.path.abspath(entry_file)), path)
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise RequirementsError(
                f"requirements={spec!r}: no such file; give a path to a requirements file "
                "or pyproject.toml, or a list of requirement strings"
            )
        return read_lines(path), path
    return [ln for s in spec for ln in s.splitlines()], "requirements="


def resolve_requirements(
    spec: Any, entry_file: str | None, category: str, mode: str, ceilings: Iterable[str] = ()
) -> Requirements:
    """Load (or discover) and filter requirements for a job (see module docstring).

    ``mode``: ``local`` keeps the lines as given; ``bundled``/``prebuilt``/``custom``
    join continuations, drop the JAX packages and refuse lines a pod cannot install.
    """
    if mode not in MODES:
        raise ValueError(f"requirements mode {mode!r}: allowed values are {', '.join(MODES)}")
    lines, source = load_spec(spec, entry_file, ceilings)
    if mode == "local":
        return Requirements([ln.rstrip() for ln in lines], source)
    lines = [ln.rstrip() for ln in join_continuations(lines)]
    lines = filter_jax(lines, category)
    check_remote(lines, source)
    return Requirements(lines, source)
