"""``BatchState``: a running batch, as one typed record that travels as JSON.

The map operator carries it across deferrals (the batch trigger echoes it in its
event), so it has a wire form (``to_dict``/``from_dict``); keys a newer version
adds survive a round trip in ``extra``.  The state knows which inputs are queued,
running (with their handles), done, retried and preempted, and the job template
every child is made from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from airflow_provider_kinetic.core.jobs.template import JobTemplate
from airflow_provider_kinetic.core.spec.handles import JobHandle

#: The most of a failed child's reason kept (``failed_why``): it travels in the state,
#: and a pod's message can be long.
REASON_MAX = 500
#: Terminal outcomes of one input.
SUCCEEDED, FAILED, CANCELLED, NOT_SUBMITTED = "SUCCEEDED", "FAILED", "CANCELLED", "NOT_SUBMITTED"


@dataclass
class BatchState:
    """Everything needed to continue a batch from any process."""

    group_id: str
    group_name: str
    template: JobTemplate
    total: int
    max_concurrent: int
    retries: int
    fail_fast: bool
    created_at: str = ""
    tags: list[str] = field(default_factory=list)
    #: Input indices waiting to be submitted, next first.
    queue: list[int] = field(default_factory=list)
    #: Running children: input index -> handle.
    active: dict[int, JobHandle] = field(default_factory=dict)
    #: Latest job id per submitted input.
    jobs: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    #: Jobs created per input so far (retries and preemptions included): the next
    #: child's deterministic job id, so a resumed batch finds every child again.
    launches: dict[int, int] = field(default_factory=dict)
    #: The highest launch of each input whose create intent the batch's launch record
    #: holds (``core.batch.launchrecord.intend``): written before any of them is created.
    intended: dict[int, int] = field(default_factory=dict)
    #: Saved by a version before create intents (its wire form has no ``intended``):
    #: its driver created children and recorded no intent, so a probing driver probes
    #: each launch of an input the launch record names none of before it creates it
    #: (``core.batch.launchrecord.intend``).  Kept on the wire once known.
    pre_intent: bool = False
    #: Launches this process recorded the intent of itself: created by no one before,
    #: so never probed (not on the wire: a driver made from a save probes them all).
    own_intents: set[tuple[int, int]] = field(
        default_factory=set, compare=False, metadata={"wire": False}
    )
    preemptions: dict[int, int] = field(default_factory=dict)
    #: ``input_retries`` in its per-class form (``core.jobs.retry_on.RetryOn.to_dict``),
    #: None for a count (``retries``, any failure); and re-submits so far per input and
    #: class under it.
    retry_on: dict[str, Any] | None = None
    resubmits: dict[int, dict[str, int]] = field(default_factory=dict)
    #: The capacity step (index into ``template.options.capacity``) each input's next job asks
    #: for, and the step its latest job was made for (``core.capacity``).
    steps: dict[int, int] = field(default_factory=dict)
    capacity_used: dict[int, str] = field(default_factory=dict)
    #: Terminal outcome per input (SUCCEEDED, FAILED, CANCELLED, NOT_SUBMITTED).
    done: dict[int, str] = field(default_factory=dict)
    #: Input indices in the order they finished.
    order: list[int] = field(default_factory=list)
    submit_errors: dict[int, str] = field(default_factory=dict)
    #: Why each failed input's last job failed, as its backend said ("exit code 3",
    #: "killed by SIGKILL", "never started: ModuleNotFoundError: ...", a pod's reason
    #: (``core.backends.local_reasons``, ``k8s/status.py``)): a job that died
    #: before writing an error payload has nothing else to tell its user.
    failed_why: dict[int, str] = field(default_factory=dict)
    stopped: bool = False
    manifest_at: float = 0.0
    manifest_dirty: bool = False
    #: Children submitted when the manifest was last written (``run.maybe_write_manifest``).
    manifest_count: int = 0
    #: Live logs: input index -> [job id, offset shown so far] of each active child
    #: (``core.batch.logs``; bounded by ``max_concurrent``).
    log_offsets: dict[int, list[Any]] = field(default_factory=dict)
    #: The last log lines of failed children, for the failure summary (bounded).
    log_tails: dict[int, list[str]] = field(default_factory=dict)
    #: Polls that read children's logs so far: which running children are read next.
    log_turn: int = 0
    #: Epoch seconds of the task's execution_timeout (None: no deadline).
    deadline: float | None = None
    #: ``core.jobs.work`` digest of the batch (function, shared arguments, every input,
    #: options): a later try resumes this batch only for the same work.
    work: str | None = None
    #: The deferral whose trigger drives the batch (launching children while the task
    #: is deferred), and how many times that trigger has saved the state: a trigger
    #: re-created after a triggerer restart continues from its own latest save.
    driver: str = ""
    seq: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return self.template.backend

    @property
    def finished(self) -> bool:
        return not self.active and not self.queue

    # ---- wire form ----------------------------------------------------------------
    _INT_KEYED = (
        "active",
        "jobs",
        "attempts",
        "launches",
        "intended",
        "preemptions",
        "resubmits",
        "steps",
        "capacity_used",
        "done",
        "submit_errors",
        "failed_why",
        "log_offsets",
        "log_tails",
    )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (JSON object keys are strings)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or not f.metadata.get("wire", True):
                continue
            if f.name == "template":
                value = value.to_dict()
            elif f.name == "active":
                value = {str(k): h.to_dict() for k, h in value.items()}
            elif f.name in self._INT_KEYED:
                value = {str(k): v for k, v in value.items()}
            elif isinstance(value, list):
                value = list(value)
            out[f.name] = value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> BatchState:
        if isinstance(value, BatchState):
            return value
        if not isinstance(value, dict) or "group_id" not in value or "template" not in value:
            raise TypeError(f"not a kinetic batch state: {value!r:.200}")
        known = {f.name for f in fields(cls) if f.metadata.get("wire", True)} - {"extra"}
        kwargs: dict[str, Any] = {k: v for k, v in value.items() if k in known}
        kwargs["template"] = JobTemplate.from_dict(value["template"])
        kwargs["active"] = {
            int(k): JobHandle.from_dict(h) for k, h in value.get("active", {}).items()
        }
        for name in cls._INT_KEYED[1:]:
            kwargs[name] = {int(k): v for k, v in value.get(name, {}).items()}
        kwargs["pre_intent"] = bool(value.get("pre_intent", "intended" not in value))
        kwargs["extra"] = {k: v for k, v in value.items() if k not in known}
        return cls(**kwargs)
