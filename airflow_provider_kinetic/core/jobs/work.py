"""What a job computes, as one digest: the rule "adopt only the same work".

A later try of a task may adopt or collect an earlier try's job only when that job
runs the work the new try would run: the same code, the same inputs, the same
options.  After a user fixes the function and clears the task, or after the inputs
changed, the earlier job is other work: it is cancelled if still running, its record
is kept for history, and the new work starts.

The digest covers:

- the code, *as the payload ships it*: the call is serialised by a pickler derived
  from cloudpickle's own (:class:`_DigestPickler`), so whatever cloudpickle carries
  by value is digested by value, and whatever it carries by reference (installed
  libraries: the image's business, covered by the options) by name.  By value means:
  a function's code object with its nested code objects, constants and names, its
  defaults, closure cells, ``__dict__`` (a ``functools.wraps`` decorator's
  ``__wrapped__``) and the globals it reads (functions, classes, constants, modules
  registered by value, recursively); a class's whole dict (methods, class
  attributes, properties, nested classes); a module of the DAG's project registered
  by value: its whole namespace.  Only what does not change what runs is left out:
  file names, line numbers and line tables (an edit above a function moves it);
  cloudpickle's per-process class tracker ids; the order of sets;
- the call: the arguments (Data as their refs, so local data by content hash),
  volumes and env, through the same pickler (sets sorted, every string written in
  full, never as a back-reference whose presence depends on interning);
- the options that change what runs or where: backend, image, requirements, FUSE
  mounts, output dir, captured env names, and the job's ``JobOptions`` as their
  fields' ``work`` metadata says (accelerator, resources and labels always; a new
  option when set; capacity, priority, run limit and checkpointing never: they change
  where or how a job runs, not what it computes);
- for a batch, every child's input.

Where the call cannot be digested (a value no pickler takes), the digest is unique
to this try (``unsure-...``): a later try never adopts work it cannot compare.

Not covered, on purpose: the try number, job and group ids, the signing key and the
encrypted env (they change every try without changing the work), and the rest of the
DAG's project directory: a deploy that changes another DAG of the same repository
must not cancel a running job that still computes the same thing.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import inspect
import io
import itertools
import json
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

#: Module globals a by-value module's namespace holds that say where it was loaded
#: from, not what it does (and the builtins cloudpickle leaves out too).
_MODULE_PLUMBING = frozenset(
    {"__builtins__", "__loader__", "__spec__", "__cached__", "__file__", "__path__"}
)
#: The prefix of a digest that could not be computed: never equal to another.
UNSURE = "unsure-"


def _digest_only(*_: Any) -> None:  # pragma: no cover - digest bytes are never loaded
    """The constructor named in digest pickles (never called: they are never read)."""


class _DigestPickler(cloudpickle.Pickler):
    """cloudpickle's pickler, made deterministic, for digests only (never read back).

    It decides by value / by reference exactly as the payload's pickler does (the
    same registrations must be in force: :func:`digesting`), and writes by-value code
    without what varies between processes or with an edit elsewhere in the file.
    """

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is str:
            # Strings in full: pickle writes an identical *object* seen twice as a
            # memo reference, and which equal strings are one object (interning)
            # differs between processes.
            return b"s" + obj.encode("utf-8", "surrogatepass")
        if kind is set or kind is frozenset:  # hash order varies between processes
            return kind.__name__, tuple(sorted(stable_bytes(x) for x in obj))
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.CodeType):
            return _digest_only, ("code",), _code_facts(obj)
        if isinstance(obj, types.FunctionType) and not _cp._should_pickle_by_reference(obj):
            return _digest_only, ("function",), _function_facts(obj)
        if isinstance(obj, type) and _class_by_value(obj):
            return _digest_only, ("class",), _class_facts(obj)
        if isinstance(obj, types.ModuleType) and not _cp._should_pickle_by_reference(obj):
            names = sorted(k for k in vars(obj) if k not in _MODULE_PLUMBING)
            return _digest_only, ("module", obj.__name__), [(k, vars(obj)[k]) for k in names]
        if isinstance(obj, typing.TypeVar) and not _cp._should_pickle_by_reference(
            obj, name=obj.__name__
        ):
            facts = (obj.__bound__, obj.__constraints__, obj.__covariant__, obj.__contravariant__)
            return _digest_only, ("typevar", obj.__name__), facts
        return super().reducer_override(obj)


def _class_by_value(cls: type) -> bool:
    if cls in _cp._BUILTIN_TYPE_NAMES or cls in (type(None), type(...), type(NotImplemented)):
        return False
    return not _cp._should_pickle_by_reference(cls)


def _code_facts(code: types.CodeType) -> tuple:
    """What a code object runs: no file name, first line or line table (an edit above
    the function moves it without changing it).  Nested code objects are among the
    constants and go through the pickler again."""
    return (
        code.co_name,
        getattr(code, "co_qualname", code.co_name),
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_code,
        code.co_consts,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        getattr(code, "co_exceptiontable", b""),
    )


def _function_facts(func: types.FunctionType) -> tuple:
    """What cloudpickle ships of a by-value function (``_function_getstate``), minus
    the per-process parts: the globals its code reads, closure, defaults, dict."""
    code = func.__code__
    f_globals = {
        k: func.__globals__[k] for k in _cp._extract_code_globals(code) if k in func.__globals__
    }
    closure = []
    for cell in func.__closure__ or ():
        try:
            closure.append(cell.cell_contents)
        except ValueError:  # an empty cell
            closure.append("<empty cell>")
    submodules = _cp._find_imported_submodules(code, itertools.chain(f_globals.values(), closure))
    return (
        code,
        func.__name__,
        func.__qualname__,
        func.__module__,
        func.__doc__,
        func.__annotations__,
        func.__defaults__,
        func.__kwdefaults__,
        closure,
        f_globals,
        dict(func.__dict__),  # functools.wraps: __wrapped__, the decorated function
        sorted(m.__name__ for m in submodules),
        func.__globals__.get("__package__"),
    )


def _class_facts(cls: type) -> tuple:
    """A by-value class: its metaclass, name, bases and own dict (methods, class
    attributes, properties, nested classes), an Enum's members by value."""
    if issubclass(cls, enum.Enum):
        clsdict, _ = _cp._enum_getstate(cls)
        members: list[Any] = [(e.name, e.value) for e in cls]
    else:
        clsdict, _ = _cp._class_getstate(cls)
        members = []
    registry = clsdict.pop("_abc_impl", None)
    if isinstance(registry, list):  # registered virtual subclasses, in a stable order
        clsdict["_abc_impl"] = sorted(registry, key=lambda c: f"{c.__module__}.{c.__qualname__}")
    return type(cls), cls.__name__, cls.__qualname__, cls.__bases__, clsdict, members


@contextlib.contextmanager
def digesting(func: Any, by_value_roots: list[str] | None) -> Iterator[None]:
    """The by-value registrations the payload is pickled under (``byvalue.by_value``),
    so the digest sees by value exactly what the payload carries by value."""
    from airflow_provider_kinetic.core.jobs.byvalue import by_value

    with by_value(func, list(by_value_roots or [])):
        yield


def stable_bytes(value: Any) -> bytes:
    """``value`` serialised for a digest (see the module docstring): equal work gives
    equal bytes in any process."""
    buf = io.BytesIO()
    _DigestPickler(buf, protocol=5).dump(value)
    return buf.getvalue()


def code_digest(func: Callable[..., Any], by_value_roots: list[str] | None = None) -> str:
    """SHA-256 of a callable as the payload ships it (its code by value, see the module
    docstring).  ``functools.partial`` and bound methods: what they wrap and carry."""
    with digesting(func, by_value_roots):
        return hashlib.sha256(stable_bytes(func)).hexdigest()


def unsure(why: str) -> str:
    """A digest equal to no other: for work that could not be digested (``why``)."""
    return f"{UNSURE}{uuid.uuid4().hex} ({why})"


def call_digest(
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    volumes: list[dict[str, Any]],
    env_vars: dict[str, str],
    by_value_roots: list[str] | None = None,
) -> str:
    """SHA-256 of one call (Data already replaced by their refs), pickled under the
    payload's by-value registrations (``by_value_roots``: the DAGs folder)."""
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', type(func).__name__)}"
    h = hashlib.sha256()
    with digesting(func, by_value_roots):
        h.update(name.encode() + b"\0" + hashlib.sha256(stable_bytes(func)).hexdigest().encode())
        call = (tuple(args), dict(kwargs), list(volumes), dict(sorted(env_vars.items())))
        h.update(stable_bytes(call))
    return h.hexdigest()


def work_digest(
    *,
    call: str,
    options: dict[str, Any],
    inputs: list[tuple[tuple, dict]] | None = None,
    func: Any = None,
    by_value_roots: list[str] | None = None,
) -> str:
    """The one digest a task record keeps and a later try compares (``func`` and
    ``by_value_roots``: the registrations a batch's ``inputs`` are pickled under).
    An unsure call stays unsure: equal to nothing."""
    if call.startswith(UNSURE):
        return call
    digest_inputs = None
    if inputs is not None:
        with digesting(func, by_value_roots) if func is not None else contextlib.nullcontext():
            digest_inputs = hashlib.sha256(stable_bytes(inputs)).hexdigest()
    doc = {"call": call, "options": options, "inputs": digest_inputs}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def named_call(
    func: Callable[..., Any], args: tuple, kwargs: dict[str, Any], ignore: Iterable[str]
) -> dict[str, Any]:
    """The call's arguments by parameter name, less those named in ``ignore`` (a
    ``**kwargs`` parameter's entries by their own names): what the reuse key digests,
    so the same values passed positionally or by keyword are the same work.  A call
    that does not bind raises ``TypeError`` (the job would fail the same way)."""
    sig = inspect.signature(func)  # a partial's or a bound method's: what is left to pass
    bound = sig.bind_partial(*args, **kwargs)
    named = dict(bound.arguments)
    for name in ignore:
        if name in named:
            named.pop(name)
            continue
        for param in sig.parameters.values():
            if param.kind is param.VAR_KEYWORD and isinstance(named.get(param.name), dict):
                named[param.name] = {k: v for k, v in named[param.name].items() if k != name}
    return named


def reuse_key(work: str | None, version: str) -> str | None:
    """The key a delivered result is reused under (``core.jobs.resultcache``): the work
    digest of the call with the ignored arguments and the task run's own output dir
    left out (``work_digest`` of that call, the one notion of sameness), and the
    user's ``cache_version``.  None for work that is not sure (never reused)."""
    if not is_sure(work):
        return None
    doc = json.dumps({"work": work, "cache_version": version}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:40]


def is_sure(work: str | None) -> bool:
    """Whether ``work`` is a digest a later try can match (not None, not unsure)."""
    return bool(work) and not str(work).startswith(UNSURE)


def template_options(template: Any, capture_names: Iterable[str] | None) -> dict[str, Any]:
    """The options of a ``JobTemplate`` that change what runs or where: what the template
    resolved (backend, image, mounts, output dir, env) and its ``JobOptions`` by their
    ``work`` metadata (``core.jobs.options``: a new option is covered with no edit here,
    and only when set, so the digests made before it stay as they were)."""
    return {
        "backend": template.backend,
        "image": template.image,
        "requirements": list(template.requirements),
        "fuse": [[m.uri, m.mount_path, m.is_dir] for m in template.fuse],
        "output_dir": template.output_dir,
        "env": dict(sorted(template.env.items())),
        "capture": sorted(capture_names or []),
        **template.options.work_options(),
    }
