"""What a job computes, as one digest: the rule "adopt only the same work".

A later try of a task may adopt or collect an earlier try's job only when that job
runs the work the new try would run: the same code, the same inputs, the same
options.  After a user fixes the function and clears the task, or after the inputs
changed, the earlier job is other work: it is cancelled if still running, its record
is kept for history, and the new work starts.

The digest covers:

- the code: the callable's own code (bytecode, constants, names, defaults, closure
  values) and, transitively, the user code it reaches through its globals (functions
  and classes of the DAG file or of modules outside the Python installation, and the
  plain values it reads there) — what the payload pickles by value;
- the call: the arguments (Data as their refs, so local data by content hash),
  volumes and env, serialised so that equal values give equal bytes in any process
  (sets are sorted; classes and functions are named, their code being hashed above)
  — never the payload's pickle, whose bytes carry the client's versions and
  per-process ids;
- the options that change what runs or where: backend, accelerator, image,
  requirements, resources, FUSE mounts, labels, output dir, captured env names;
- for a batch, every child's input.

Not covered, on purpose: the try number, job and group ids, the signing key and the
encrypted env (they change every try without changing the work), and the rest of the
DAG's project directory: a deploy that changes another DAG of the same repository
must not cancel a running job that still computes the same thing.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import pickle
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

#: Types reduced to their names: equal code -> equal bytes (their code is hashed apart).
_NAMED = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)


class _StablePickler(pickle.Pickler):
    """A pickler for digests only (never read back): sets sorted, code by name."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _NAMED) and not _importable(obj):
            # A class or function defined in the DAG file (or a lambda, a local one):
            # its name stands for it (the code a task reaches is hashed by code_digest).
            module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
            name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
            return str, (f"<{type(obj).__name__} {module}.{name}>",)
        return NotImplemented  # importable classes and functions: by reference, as usual

    def persistent_id(self, obj: Any) -> Any:
        # Sets iterate in hash order, which varies between processes for strings; pickle
        # saves sets without asking reducer_override, but asks this for every object.
        if type(obj) in (set, frozenset):
            return type(obj).__name__, tuple(sorted(stable_bytes(x) for x in obj))
        return None


def _importable(obj: Any) -> bool:
    """Whether pickle saves ``obj`` by its import path (module + qualified name)."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__ in sys.modules
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    target: Any = module
    for part in (getattr(obj, "__qualname__", None) or "<>").split("."):
        target = getattr(target, part, None)
    return module is not None and target is obj


def stable_bytes(value: Any) -> bytes:
    """``value`` serialised for a digest (see the module docstring)."""
    buf = io.BytesIO()
    _StablePickler(buf, protocol=5).dump(value)
    return buf.getvalue()


def code_digest(func: Callable[..., Any]) -> str:
    """SHA-256 of a callable's code and the user code it reaches (see the module
    docstring).  ``functools.partial`` and bound methods hash what they wrap."""
    h = hashlib.sha256()
    _digest_code(func, h, set())
    return h.hexdigest()


def _digest_code(obj: Any, h: Any, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, type):  # a user class: its methods' code, class attributes
        for name, value in sorted(vars(obj).items()):
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, types.FunctionType):
                h.update(name.encode())
                _digest_code(value, h, seen)
        return
    codes = list(_code_objects(obj))
    for code in codes:
        h.update(stable_bytes(_code_facts(code)))
    h.update(stable_bytes(_bound_values(obj)))
    namespace = getattr(_innermost(obj), "__globals__", None) or {}
    for name in sorted({n for code in codes for n in _names(code)}):
        if name not in namespace:
            continue  # a builtin, an attribute name
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            continue
        if isinstance(value, types.FunctionType | type):
            if _user_code(value):
                h.update(name.encode())
                _digest_code(value, h, seen)
            continue  # a library's: its name in the bytecode stands for it
        try:  # a plain value the code reads (a constant of the DAG file)
            h.update(name.encode() + stable_bytes(value))
        except Exception:  # noqa: BLE001 - a value no pickler takes: its type, at least
            h.update(name.encode() + type(value).__qualname__.encode())


def _innermost(func: Any) -> Any:
    while True:
        inner = getattr(func, "func", None) or getattr(func, "__func__", None)
        if inner is None or inner is func:
            return func
        func = inner


def _names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


#: Where installed packages live: code elsewhere is the user's (the DAGs folder).
_INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})


def _user_code(value: Any) -> bool:
    """Code the payload carries by value: the DAG file's, or a module's outside the
    Python installation (helpers next to the DAG)."""
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or path is None:
        return module is not None and module.__name__ != "builtins"
    return not path.startswith(_INSTALLED) and "site-packages" not in path


def _bound_values(func: Any) -> list[Any]:
    """Values a callable carries besides its code: defaults, closure cells, a partial's
    arguments, a callable object's attributes (recursively for what they wrap)."""
    out: list[Any] = [getattr(func, "__defaults__", None), getattr(func, "__kwdefaults__", None)]
    for cell in getattr(func, "__closure__", None) or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            out.append(None)
    if isinstance(func, functools.partial):
        out += [func.args, func.keywords, _bound_values(func.func)]
    elif isinstance(func, types.MethodType):  # a bound method: its object's state
        out.append(getattr(func.__self__, "__dict__", None))
    elif not isinstance(func, types.FunctionType | types.BuiltinFunctionType):
        out.append(getattr(func, "__dict__", None))  # a callable object
    return out


def _code_objects(func: Any) -> Iterable[types.CodeType]:
    inner = getattr(func, "func", None) or getattr(func, "__func__", None)
    if inner is not None and inner is not func:  # partial / bound method
        yield from _code_objects(inner)
    code = getattr(func, "__code__", None)
    if code is None and not isinstance(func, types.FunctionType):
        call = vars(type(func)).get("__call__")  # a callable object: its class's __call__
        code = getattr(call, "__code__", None)
    if code is not None:
        yield code


def _code_facts(code: types.CodeType) -> tuple:
    consts = tuple(_code_facts(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return (code.co_name, code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)


def call_digest(
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    volumes: list[dict[str, Any]],
    env_vars: dict[str, str],
) -> str:
    """SHA-256 of one call (Data already replaced by their refs)."""
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', type(func).__name__)}"
    h = hashlib.sha256()
    h.update(name.encode() + b"\0" + code_digest(func).encode())
    h.update(
        stable_bytes((tuple(args), dict(kwargs), list(volumes), dict(sorted(env_vars.items()))))
    )
    return h.hexdigest()


def work_digest(
    *,
    call: str,
    options: dict[str, Any],
    inputs: list[tuple[tuple, dict]] | None = None,
) -> str:
    """The one digest a task record keeps and a later try compares."""
    doc = {
        "call": call,
        "options": options,
        "inputs": hashlib.sha256(stable_bytes(inputs)).hexdigest() if inputs is not None else None,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def template_options(template: Any, capture_names: Iterable[str] | None) -> dict[str, Any]:
    """The options of a ``JobTemplate`` that change what runs or where."""
    return {
        "backend": template.backend,
        "accelerator": template.accelerator,
        "image": template.image,
        "requirements": list(template.requirements),
        "cpu": template.cpu,
        "memory": template.memory,
        "fuse": [[m.uri, m.mount_path, m.is_dir] for m in template.fuse],
        "labels": dict(sorted(template.labels.items())),
        "output_dir": template.output_dir,
        "env": dict(sorted(template.env.items())),
        "capture": sorted(capture_names or []),
    }
