"""What a job's payload carries *by value*: the user's code, registered with cloudpickle
while a call is packed or digested.

The pod has no DAG files: the callable's own modules and every loaded module under the
by-value roots (the DAGs folder) travel inside the payload, never the standard library,
Airflow, kinetic or this package (importable on every runner).  ``core.jobs.payload``
packs under these registrations, ``core.jobs.work`` digests under the same ones.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

#: Modules never pickled by value even when they live under a by-value root.
_NEVER_BY_VALUE = ("airflow_provider_kinetic", "airflow", "kinetic", "__main__")


def _modules_under(roots: list[str]) -> list[Any]:
    """The loaded modules whose files lie under one of ``roots`` (symlinks resolved)."""
    real_roots = tuple(os.path.realpath(r) + os.sep for r in roots if r)
    if not real_roots:
        return []
    real_dirs: dict[str, str] = {}
    found = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] in _NEVER_BY_VALUE:
            continue
        path = getattr(mod, "__file__", None)
        if path and _real_file(path, real_dirs).startswith(real_roots):
            found.append(mod)
    return found


def _real_file(path: str, real_dirs: dict[str, str]) -> str:
    """``os.path.realpath(path)``, resolving each directory once per call: a task
    process has ~1,500 modules in a few hundred directories, and a full realpath per
    module (an lstat per path component) cost ~50 ms of every job's submit.  The file
    itself is resolved in full only when it is a symlink."""
    head, tail = os.path.split(path)
    real_head = real_dirs.get(head)
    if real_head is None:
        real_head = real_dirs[head] = os.path.realpath(head)
    if os.path.islink(path):
        return os.path.realpath(path)
    return os.path.join(real_head, tail)


def _layers(func: Any) -> Iterator[Any]:
    """``func``, then what each ``functools.partial`` or bound method wraps, inwards."""
    seen: set[int] = set()
    while id(func) not in seen:
        seen.add(id(func))
        yield func
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, types.MethodType):
            func = func.__func__


def underlying(func: Any) -> Any:
    """The user's code behind a callable: the function a ``functools.partial`` or a
    bound method wraps (at any depth), or a callable object's class.

    A partial reports its *class's* module, ``functools``; registering that for by-value
    pickling (instead of the user's module) made every partial fail to pickle.
    """
    *_, inner = _layers(func)
    if isinstance(inner, types.FunctionType | types.BuiltinFunctionType | type):
        return inner
    return type(inner)  # a callable object: its class holds the code


def _own_modules(func: Any) -> list[str]:
    """The modules of the user code a callable runs: its underlying function's, and each
    bound method's object's class (a method may live on a base class elsewhere)."""
    names = [getattr(underlying(func), "__module__", None)]
    for layer in _layers(func):
        if isinstance(layer, types.MethodType):
            owner = layer.__self__
            names.append(
                getattr(owner if isinstance(owner, type) else type(owner), "__module__", None)
            )
    return [n for n in dict.fromkeys(names) if isinstance(n, str)]


def _library(mod: Any) -> bool:
    """Standard library, builtins and this package: importable on every runner, and
    never pickled by value (their C types cannot be)."""
    top = mod.__name__.split(".")[0]
    return top in _NEVER_BY_VALUE or top in sys.stdlib_module_names


@contextlib.contextmanager
def by_value(func: Callable[..., Any], roots: list[str]) -> Iterator[None]:
    """Register the callable's own modules (``underlying``) and modules under ``roots``
    for by-value pickling.

    Re-entrant: an inner ``by_value`` of the same callable and roots (the work digest
    inside ``core.jobs.pack.prepare``'s one registration) finds them registered and
    scans nothing; the outermost one unregisters.  The scan of every loaded module is
    the costliest part of packing a call (about 10-25 ms a job)."""
    key = (id(func), tuple(roots))
    with _ACTIVE_LOCK:  # held through a first scan: a second thread waits, then shares
        active = _ACTIVE.get(key)
        if active is None:
            _ACTIVE[key] = [1, _register(func, roots)]
        else:
            active[0] += 1
    try:
        yield
    finally:
        _leave(key)


#: The registrations ``by_value`` holds: (callable id, roots) -> [depth, modules].
_ACTIVE: dict[tuple[int, tuple[str, ...]], list[Any]] = {}
_ACTIVE_LOCK = threading.Lock()


def _register(func: Callable[..., Any], roots: list[str]) -> list[Any]:
    mods = _modules_under(roots)
    for name in _own_modules(func):
        own = sys.modules.get(name)
        if own is not None and not _library(own) and own not in mods:
            mods.append(own)
    registered = []
    for mod in mods:
        try:
            cloudpickle.register_pickle_by_value(mod)
            registered.append(mod)
        except ValueError:  # not importable by its own name; cloudpickle copes by reference
            continue
    return registered


def _leave(key: tuple[int, tuple[str, ...]]) -> None:
    with _ACTIVE_LOCK:
        active = _ACTIVE[key]
        active[0] -= 1
        if active[0]:
            return
        del _ACTIVE[key]
    for mod in active[1]:
        with contextlib.suppress(ValueError):
            cloudpickle.unregister_pickle_by_value(mod)
