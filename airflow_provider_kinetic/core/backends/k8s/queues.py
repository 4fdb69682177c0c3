"""Where a job waits in its Kueue queue: its position, from Kueue's visibility API.

A Job created suspended in a Kueue local queue (``capacity="queue:team-a"``) reads
``PENDING (NotAdmitted): waiting for admission in queue team-a``.  Kueue's on-demand
visibility API (``VisibilityOnDemand``, beta and on by default since Kueue 0.9) lists
the pending workloads of a local queue in admission order::

    GET /apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/{queue}/pendingworkloads
    -> {"kind": "PendingWorkloadsSummary", "items": [{"metadata": {"name": ...,
        "ownerReferences": [{"kind": "Job", "name": <the Job>, ...}]},
        "localQueueName": ..., "positionInLocalQueue": 0, "positionInClusterQueue": 0}]}

(Kueue's "Pending Workloads on-demand" page, ``site/content/en/docs/tasks/manage/
monitor_pending_workloads/pending_workloads_on_demand.md`` in kubernetes-sigs/kueue:
the path, ``positionInLocalQueue`` counted from 0, ``ownerReferences`` naming the
Job, ``limit`` 1000 by default.)  The report then says ``waiting for admission:
position 3 of 7 in queue team-a``.

One read per (namespace, queue) per :data:`REFRESH_S` per backend (:class:`QueuePositions`),
whatever the number of jobs waiting in it: the triggerer's shared reader answers all
its subscribers from one backend, so its jobs share the read.  A cluster without the
API (an older Kueue, the feature off, RBAC refusing it) answers 403/404/503: the
report stays as it was, and the queue is not asked again before the refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from airflow_provider_kinetic.core.backends.k8s.api import Call, Plan
from airflow_provider_kinetic.core.backends.k8s.transport import RAW_API
from airflow_provider_kinetic.core.spec.handles import StatusReport

T = TypeVar("T")

#: Kueue's visibility API for one local queue's pending workloads.
PENDING_PATH = (
    "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{namespace}/localqueues/{name}"
    "/pendingworkloads"
)
#: Seconds a queue's answer is used before it is read again.
REFRESH_S = 60.0


@dataclass(frozen=True)
class QueuePosition:
    """A job's place in its local queue: ``position`` (1 = next) of ``of`` pending."""

    position: int
    of: int
    queue: str

    def describe(self) -> str:
        return f"position {self.position} of {self.of} in queue {self.queue}"


def pending_call(namespace: str, queue: str) -> Call:
    """The visibility API read of ``queue``'s pending workloads (the client quotes the
    path's parts)."""
    return Call(
        RAW_API,
        "call_api",
        (PENDING_PATH, "GET"),
        {
            "path_params": {"namespace": namespace, "name": queue},
            "header_params": {"Accept": "application/json"},
            "auth_settings": ["BearerToken"],
            "_return_http_data_only": True,
        },
    )


def positions_from(summary: Any, queue: str) -> dict[str, QueuePosition]:
    """``{owner name: position}`` from a ``PendingWorkloadsSummary`` (the Job that owns
    each pending workload); items without a position or an owner are skipped."""
    found = [i for i in (summary or {}).get("items") or [] if isinstance(i, dict)]
    out: dict[str, QueuePosition] = {}
    for item in found:
        where = item.get("positionInLocalQueue")
        if not isinstance(where, int) or isinstance(where, bool):
            continue
        for owner in (item.get("metadata") or {}).get("ownerReferences") or []:
            name = owner.get("name") if isinstance(owner, dict) else None
            if name:
                out[name] = QueuePosition(where + 1, len(found), queue)
    return out


class Answers(Generic[T]):
    """The last answer per key, read again after ``refresh_s``: what a status read
    asks the cluster at most once a minute (queue positions; ``pending.Seen``)."""

    def __init__(
        self, refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be >= 0 seconds, got {refresh_s!r}")
        self.refresh_s, self.clock = refresh_s, clock
        self._seen: dict[tuple[str, str], tuple[float, T]] = {}

    def fresh(self, key: tuple[str, str]) -> T | None:
        """The answer for ``key`` while it is younger than ``refresh_s``, else None."""
        seen = self._seen.get(key)
        return seen[1] if seen is not None and self.clock() - seen[0] < self.refresh_s else None

    def keep(self, key: tuple[str, str], found: T) -> T:
        self._seen[key] = (self.clock(), found)
        return found


class QueuePositions(Answers[dict[str, QueuePosition]]):
    """The last positions per (namespace, queue), read again after ``refresh_s``."""

    def plan(self, namespace: str, queue: str) -> Plan[dict[str, QueuePosition]]:
        """The queue's positions: the last answer while fresh, else one read."""
        key = (namespace, queue)
        if (found := self.fresh(key)) is not None:
            return found
        reply = yield pending_call(namespace, queue)
        try:
            found = positions_from(reply.json(), queue) if reply.ok else {}
        except ValueError:  # not JSON: a proxy's page, not Kueue's answer
            found = {}
        return self.keep(key, found)


#: One :class:`QueuePositions` per cluster and credentials in this process (:func:`shared`).
_SHARED: dict[Hashable, QueuePositions] = {}


def shared(key: Hashable) -> QueuePositions:
    """The process's :class:`QueuePositions` for ``key`` (a cluster and the credentials
    that read it), for backends made per request (the Kinetic pages)."""
    return _SHARED.setdefault(key, QueuePositions())


def fold(report: StatusReport, position: QueuePosition | None) -> StatusReport:
    """The NotAdmitted report with the job's position in one line (unchanged without one)."""
    if position is None:
        return report
    return replace(report, message=f"waiting for admission: {position.describe()}")
