"""Packing the call (function + arguments) and the result, in kinetic's wire shapes.

The payload is one cloudpickle dict (``func``, ``args``, ``kwargs``, ``env_vars``,
``has_data_refs``, ``volumes``, ``client_fingerprint``) so a kinetic runner can execute
our jobs and ours can execute kinetic's.  Code from the DAG file and modules under
the DAGs folder is pickled *by value*: the pod has no DAG files.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle

from airflow_provider_kinetic.core.data import KEEP, map_leaves
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.jobs.byvalue import by_value
from airflow_provider_kinetic.core.version import __version__

if TYPE_CHECKING:
    from airflow_provider_kinetic.core.data import Data


class UnpicklableArgumentError(KineticError, ValueError):
    """An argument (or the callable) cannot be serialised; names which one."""


# ---- Data discovery and replacement ---------------------------------------------


def find_data(obj: Any, where: str) -> Iterator[tuple[Data, str]]:
    """Yield every ``Data`` in list/tuple/dict containers with a readable location."""
    from airflow_provider_kinetic.core.data import Data  # not at import: see _LAZY there

    if isinstance(obj, Data):
        yield obj, where
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if _holds_data(k):
                raise TypeError(f"Data cannot be a dict key (at {where})")
            yield from find_data(v, f"{where}[{k!r}]")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from find_data(v, f"{where}[{i}]")
    elif isinstance(obj, set | frozenset) and any(_holds_data(v) for v in obj):
        raise TypeError(f"Data inside a set is not supported (at {where}); use a list")


def data_found(obj: Any, where: str) -> list[tuple[Data, str]]:
    """:func:`find_data`'s finds for readers that must not fail (lineage, inlets at
    parse time): a Data where packing refuses one (a dict key, a set) is reported by
    the submit, so here the walk just stops there."""
    found: list[tuple[Data, str]] = []
    try:
        for item in find_data(obj, where):
            found.append(item)
    except TypeError:
        pass
    return found


def _holds_data(value: Any) -> bool:
    """Whether ``value`` is or contains a Data (e.g. a tuple set element or dict key)."""
    try:
        return next(find_data(value, ""), None) is not None
    except TypeError:  # a set or dict key holding Data further down
        return True


def replace_data(obj: Any, refs: dict[int, dict[str, Any]]) -> Any:
    """Return ``obj`` with each ``Data`` replaced by its ref dict (keyed by ``id``)."""
    from airflow_provider_kinetic.core.data import Data

    return map_leaves(obj, lambda x: refs[id(x)] if isinstance(x, Data) else KEEP)


# ---- payload ----------------------------------------------------------------------


def client_fingerprint() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "cloudpickle": cloudpickle.__version__,
        "kinetic": __version__,
    }


def _name_culprit(func: Any, args: tuple, kwargs: dict, exc: Exception) -> str:
    """Bisect the payload to name what cannot be pickled (function, argument, kwarg)."""
    candidates = [("the callable", func)]
    candidates += [(f"op_args[{i}]", a) for i, a in enumerate(args)]
    candidates += [(f"op_kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for label, value in candidates:
        try:
            cloudpickle.dumps(value)
        except Exception as inner:  # noqa: BLE001 - any failure names the culprit
            return f"{label} ({type(value).__name__}) cannot be pickled: {inner}"
    return f"the payload cannot be pickled: {exc}"


def pack_payload(
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    env_vars: dict[str, str],
    volumes: list[dict[str, Any]] | None = None,
    has_data_refs: bool,
    by_value_roots: list[str] | None = None,
    batch_inputs: dict[str, str] | None = None,
) -> bytes:
    """cloudpickle the call into kinetic's payload dict; names an unpicklable argument.

    ``batch_inputs`` (uri + sha256 of a batch's inputs blob) makes a batch payload:
    the function moves to ``batch_func`` and ``func`` becomes a loud guard.
    """
    from airflow_provider_kinetic.core.jobs import batchwire

    payload: dict[str, Any] = {
        "func": func,
        "args": tuple(args),
        "kwargs": dict(kwargs),
        "env_vars": dict(env_vars),
        "has_data_refs": has_data_refs,
        "client_fingerprint": client_fingerprint(),
    }
    if volumes:
        payload["volumes"] = volumes
    if batch_inputs:
        payload.update(func=batchwire.batch_guard, batch_func=func, batch_inputs=batch_inputs)
        cloudpickle.register_pickle_by_value(batchwire)
    with by_value(func, by_value_roots or []):
        try:
            return cloudpickle.dumps(payload)
        except Exception as exc:
            raise UnpicklableArgumentError(_name_culprit(func, args, kwargs, exc)) from exc
        finally:
            if batch_inputs:
                cloudpickle.unregister_pickle_by_value(batchwire)


def build_context_zip() -> bytes:
    """A plan-only ``context.zip`` for a job without a DAG file (plain Python use).

    The code travels by value inside the payload; the plan keeps kinetic's runner
    (which insists on a context archive) happy.  With a DAG file the context is its
    project directory (``core.runtime.context``).
    """
    from airflow_provider_kinetic.core.runtime.context import minimal_context

    return minimal_context()


# ---- result ------------------------------------------------------------------------


def exception_strings(exc: BaseException) -> tuple[str, str]:
    """``(module.qualname, str(exc))`` of an exception, as plain strings.

    Recorded next to the pickled exception so a client that cannot rebuild it (a
    constructor that does not take its own ``args`` back, a class not importable
    there) still shows what was raised.  ``str`` of a broken ``__str__`` never fails.
    """
    cls = type(exc)
    name = f"{cls.__module__}.{cls.__qualname__}"
    try:
        return name, str(exc)
    except Exception as inner:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return name, f"<str() failed: {type(inner).__name__}: {inner}>"


def make_result(
    *,
    success: bool,
    result: Any = None,
    exception: BaseException | None = None,
    traceback: str | None = None,
    phase: str = "execute",
    host_index: int = 0,
    exit_code: int | None = None,
) -> dict[str, Any]:
    """kinetic's result dict (``phase``: the phase it failed in, a key kinetic's
    client reads); with an exception, also ``exception_type`` and
    ``exception_message`` (plain strings), and with ``exit_code`` the code the
    function exited with (``sys.exit``): additive keys kinetic's client ignores."""
    payload = {
        "success": success,
        "result": result,
        "exception": exception,
        "traceback": traceback,
        "phase": phase,
        "host_index": host_index,
    }
    if exception is not None:
        payload["exception_type"], payload["exception_message"] = exception_strings(exception)
    if exit_code is not None:
        payload["exit_code"] = exit_code
    return payload


def dump_result(payload: dict[str, Any]) -> tuple[bytes, bool]:
    """Serialise a result dict; an unpicklable value becomes a described failure.

    Returns the bytes and whether the original payload could be serialised.  A
    failure whose exception could not be pickled keeps that exception's type name,
    message and traceback as strings.
    """
    try:
        return cloudpickle.dumps(payload), True
    except Exception as exc:  # noqa: BLE001
        value = payload.get("result") if payload.get("success") else payload.get("exception")
        fallback = make_result(
            success=False,
            exception=RuntimeError(f"Result serialization failed: {type(exc).__name__}: {exc}"),
            traceback=payload.get("traceback"),
            phase="result serialization",
            host_index=payload.get("host_index", 0),
        )
        if not payload.get("success") and payload.get("exception_type"):
            fallback["exception_type"] = payload["exception_type"]
            fallback["exception_message"] = payload.get("exception_message")
        fallback["serialization_failed"] = True
        fallback["result_repr"] = repr(value)[:20_000]
        return cloudpickle.dumps(fallback), False


class RemoteFunctionError(KineticError, RuntimeError):
    """Raised on the worker when the remote function failed and its exception is lost.

    When the remote exception could not be rebuilt here, ``remote_type`` (module +
    qualname), ``remote_message`` (its ``str``) and ``remote_traceback`` say what it
    was; the message reads ``{remote_type}: {remote_message}``.
    """

    def __init__(
        self,
        message: str,
        *,
        remote_type: str | None = None,
        remote_message: str | None = None,
        remote_traceback: str | None = None,
    ):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback


def remote_error(
    result: dict[str, Any],
    why: str,
    found_type: str | None = None,
    found_message: str | None = None,
) -> RemoteFunctionError:
    """The failure in ``result`` whose exception could not be rebuilt here (``why``),
    from the strings the runner recorded; ``found_type``/``found_message`` are what
    the pickle itself named, used when there are none (kinetic's own runner)."""
    name = result.get("exception_type") or found_type or "unknown exception"
    message = result.get("exception_message") if result.get("exception_type") else found_message
    err = RemoteFunctionError(
        f"{name}: {message}" if message else name,
        remote_type=name,
        remote_message=message,
        remote_traceback=result.get("traceback"),
    )
    err.add_note(f"The remote {name} could not be rebuilt here: {why}")
    return err


def raise_remote_failure(result: dict[str, Any], where: str) -> None:
    """Re-raise the remote exception with the remote phase and traceback as notes."""
    exc = result.get("exception")
    if not isinstance(exc, BaseException) and result.get("exception_type"):
        exc = remote_error(result, "the payload holds no exception object")
    elif not isinstance(exc, BaseException):
        exc = RemoteFunctionError(f"remote job failed without an exception object ({where})")
    recorded = result.get("exception_message")
    rebuilt = getattr(exc, "remote_type", None) is None  # not made from the strings
    if rebuilt and recorded is not None and exception_strings(exc)[1] != recorded:
        # Rebuilt, but not as raised (a constructor with defaults), or stood in for
        # (an exception the runner could not pickle): say what was raised.
        exc.add_note(f"Remote error: {result.get('exception_type')}: {recorded}")
    if result.get("serialization_failed"):
        exc.add_note(f"Unserialisable return value: {result.get('result_repr', '')[:2000]}")
    exc.add_note(f"Failed during kinetic phase: {result.get('phase', 'unknown')}")
    if result.get("traceback"):
        exc.add_note("Remote traceback:\n" + result["traceback"])
    raise exc
