"""What failed: a job's failure as a class and a phase (``Failure``), on the wire.

Every failed job has a **class** (``FailureClass``: what kind of thing went wrong,
which decides whether a re-submit can help) and, where the runner got that far, a
**phase** (kinetic's phases, in the order a job goes through them: the one it was
in when it failed).  ``core.jobs.classify`` makes a ``Failure`` from what the job
left (its failure payload, its status); the Airflow layer raises it as a typed
exception (``exceptions.py``), logs it in one line (:meth:`Failure.describe`) and
puts :meth:`Failure.to_dict` in XCom ``kinetic_job`` and the history entry.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


class FailureClass(enum.StrEnum):
    """What kind of thing went wrong."""

    #: The function raised (or returned a value that cannot be stored).
    USER_ERROR = "user_error"
    #: The platform or the job's environment: an image that does not pull, out of
    #: memory, a container crash outside the function, a lost node, an eviction, a
    #: failing requirements install, a Data input that cannot be read.
    INFRA = "infra"
    #: The machine was taken away (a spot VM reclaimed, a node shut down under the job).
    PREEMPTION = "preemption"
    #: No capacity came within the capacity wait.
    NO_CAPACITY = "no_capacity"
    #: The task's ``execution_timeout`` (or the job's run deadline) passed.
    TIMEOUT = "timeout"
    #: Someone cancelled the job.
    CANCELLED = "cancelled"
    #: The store could not be read or written (the result, its signature).
    STORE = "store"


#: kinetic's phases, in the order a job goes through them.
PHASES = (
    "startup",
    "artifact download",
    "artifact verification",
    "requirements install",
    "context extract",
    "payload unpickle",
    "environment setup",
    "data resolve",
    "debugger setup",
    "execute",
    "result serialization",
)
#: Phases of this package's runner beside kinetic's: a batch child picking its input,
#: upstream results passed by reference, and storing the result payload.
OWN_PHASES = ("batch input", "result reference resolve", "store result")
#: The phases the function's own code runs in.
USER_PHASES = frozenset({"execute", "result serialization"})
#: A multi-slice host's exit code after a failure of the function's own code: the
#: JobSet then fails the whole gang at once instead of restarting it
#: (``k8s/manifests.jobset_manifest``: a pod failure policy and a JobSet failure rule).
USER_ERROR_EXIT = 86


@dataclass(frozen=True)
class Failure:
    """One failed job: its class, its phase, and what the failing host said.

    ``host_index`` / ``host_count``: which host of a multi-host job failed (the lowest
    failing one) of how many; ``other_hosts``: the other hosts that failed too;
    ``slice_hosts``: a multi-slice job's hosts per slice (host ``i`` is host
    ``i % slice_hosts`` of slice ``i // slice_hosts``).
    ``exception_type`` (module + qualname), ``exception_message`` and ``traceback``:
    the remote exception as strings; ``reason``: the platform's (``StatusReport``);
    ``message``: what happened, in words (the remote error, else the platform's)."""

    failure_class: FailureClass
    phase: str | None = None
    job_id: str | None = None
    exit_code: int | None = None
    host_index: int | None = None
    host_count: int | None = None
    other_hosts: tuple[int, ...] = ()
    slice_hosts: int | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    traceback: str | None = None
    reason: str | None = None
    message: str = ""

    def describe(self) -> str:
        """The task log's line: ``failed in phase data resolve (infra) on host 2 of 4:
        FileNotFoundError: ...``."""
        text = "failed"
        if self.phase:
            text += f" in phase {self.phase}"
        text += f" ({self.failure_class.value})"
        if self.host_index is not None and self.slice_hosts:
            where, host = divmod(self.host_index, self.slice_hosts)
            slices = (self.host_count or self.slice_hosts) // self.slice_hosts
            text += f" on slice {where} host {host} ({slices} slices of {self.slice_hosts} hosts)"
        elif self.host_index is not None and (self.host_count or 1) > 1:
            text += f" on host {self.host_index} of {self.host_count}"
        if self.exit_code is not None:
            text += f", exit code {self.exit_code}"
        if self.other_hosts:
            text += f" (hosts {', '.join(map(str, self.other_hosts))} failed too)"
        what = self.what()
        return f"{text}: {what}" if what else text

    def what(self) -> str:
        """The remote error as ``Type: message``, else the platform's words."""
        if self.exception_type:
            name = self.exception_type.removeprefix("builtins.")
            return f"{name}: {self.exception_message}" if self.exception_message else name
        return self.message or self.reason or ""

    def to_dict(self) -> dict[str, Any]:
        """JSON for XCom and history: ``class`` is the class's value; no traceback
        (the task log and the job's log hold it)."""
        out: dict[str, Any] = {"class": self.failure_class.value}
        for f in fields(self):
            if f.name in ("failure_class", "traceback"):
                continue
            value = getattr(self, f.name)
            if value not in (None, "", ()):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Failure:
        known = {f.name for f in fields(cls)} - {"failure_class"}
        kwargs = {k: v for k, v in value.items() if k in known}
        if "other_hosts" in kwargs:
            kwargs["other_hosts"] = tuple(kwargs["other_hosts"])
        return cls(FailureClass(value["class"]), **kwargs)
