"""GKE request rate (issue 12, goal 4): the fast first polls must not reach a cluster.

The real ``KineticJobTrigger`` waits for a GKE Job on the loopback Kubernetes API
double (``tests/fixtures/k8s_double.py``, real ``kubernetes`` clients over HTTP) while
a fake clock stands in for the 10 minutes: the triggerer's shared reader (through which
a deferred GKE job's status comes, one list per interval) runs on
``tests/fixtures/triggerer.FakeClock``, and the Job succeeds when it reaches ``JOB_S``.
A list counts as a status read.  Every request the trigger sends is counted by the
double.  The goal is
the rate of constant ``poll_interval`` polling, which this code had before the local
backend got its fast first polls: a read at submission and one every 5 s, 121 in
10 minutes.  Sync tasks poll on the same schedule (``core.jobs.polling.poll_delays``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from typing import Any

from table import Row

JOB_S = 600.0
POLL_S = 5.0
#: today's status reads: one at submission, then one every POLL_S until the job ends
GOAL_READS = 1 + math.floor(JOB_S / POLL_S)


def kind(method: Any, path: str, job_path: str) -> str:
    """A request's kind, for the note: job reads, pod lists, log reads, other."""
    if str(getattr(method, "value", method)) != "GET":
        return f"{getattr(method, 'value', method)} {path}"
    if path == job_path:
        return "job reads"
    if path == job_path.rsplit("/", 1)[0]:
        return "job lists"
    return "log reads" if path.endswith("/log") else "pod lists" if path.endswith("/pods") else path


async def drive() -> tuple[int, Counter[str], float, str]:
    """Status reads, requests by kind, fake seconds waited and the trigger's event."""
    from airflow_provider_kinetic.core.backends import shared_reads
    from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
    from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
    from airflow_provider_kinetic.core.spec.handles import JobHandle
    from airflow_provider_kinetic.core.spec.pod import SpecInputs, build_job_spec
    from tests.fixtures.k8s_double import by_code_under_test, running_double
    from tests.fixtures.triggerer import FakeClock, trigger_for

    job_id, bucket, ns = "job-00bench0", "bench-jobs", "default"
    spec = build_job_spec(
        SpecInputs(
            job_id=job_id, bucket=bucket, accelerator=parse_accelerator("cpu"),
            context_uri=f"gs://{bucket}/c.zip", payload_uri=f"gs://{bucket}/p.pkl",
            result_uri=f"gs://{bucket}/r.pkl", payload_sha256="a" * 64,
            context_sha256="b" * 64, image="img", output_dir=f"gs://{bucket}/out/",
        )
    )  # fmt: skip
    async with running_double() as api:
        backend = GkeBackend(api.client_factory())
        await asyncio.to_thread(backend.submit, spec)
        name = backend.object_name(job_id)
        job_path = f"/apis/batch/v1/namespaces/{ns}/jobs/{name}"
        pods = f"/api/v1/namespaces/{ns}/pods"
        worker = [{"name": "kinetic-worker", "state": {"running": {}}}]
        meta = {"name": f"{name}-x1", "labels": {"job-name": name, "job-id": job_id}}
        containers = [{"name": "kinetic-worker", "image": "img"}]
        await api.create(pods, {"metadata": meta, "spec": {"containers": containers}})
        await api.patch_status(f"{pods}/{name}-x1", {"phase": "Running",
                                                     "containerStatuses": worker})  # fmt: skip
        api.write_log(ns, f"{name}-x1", "step 1")  # the log stream is served (200)
        api.forget_requests()  # count the trigger's requests only
        # A deferred GKE job's status comes from the triggerer's shared reader (one list
        # per interval, ``core.backends.shared_reads``): its clock is the fake one.
        clock = FakeClock(expect=1)
        shared_reads.install(shared_reads.SharedReads(clock))

        async def succeed() -> None:
            await api.patch_status(job_path, {"succeeded": 1})

        clock.at(JOB_S, succeed)
        handle = JobHandle(job_id=job_id, backend="gke", bucket_name=bucket,
                           namespace=ns, k8s_name=name)  # fmt: skip
        # The trigger makes its backend from the connection's config (cluster auth);
        # here it gets the one that talks to the double, and a store in a temp dir.
        trigger = trigger_for(handle, backend, poll_interval=POLL_S)
        events = [e async for e in trigger.run()]
        sent = by_code_under_test(api.requests)
        jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"  # a shared list reads it too
        reads = sum(1 for r in sent if r.method == "GET" and r.url.path in (job_path, jobs))
        kinds = Counter(kind(r.method, r.url.path, job_path) for r in sent)
        status = events[0].payload["status"] if len(events) == 1 else f"{len(events)} events"
        return reads, kinds, clock.t, status


def gke_status_reads(timeout_s: float = 600.0) -> Row:
    """The row: status reads of a 10-minute GKE job at the default poll_interval."""
    case = f"status reads, {JOB_S / 60:g}-minute GKE job, poll_interval {POLL_S:g} s"
    try:
        import kmock  # noqa: F401 - the API double's server (a dev dependency)
    except ImportError:
        return Row.skipped(case, "kmock (the API double) is not installed")
    quiet = [logging.getLogger(n) for n in ("aiohttp.access", "airflow_provider_kinetic")]
    levels = [q.level for q in quiet]
    for q in quiet:  # one access-log line per request would bury the table
        q.setLevel(logging.WARNING)
    try:
        # A trigger that never sent its event would hang the benchmark: bounded.
        reads, kinds, waited, status = asyncio.run(asyncio.wait_for(drive(), timeout_s))
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)
    total = sum(kinds.values())
    return Row(
        case,
        f"every {POLL_S:g} s: {GOAL_READS}",
        f"{reads} ({total} requests)",
        None,
        f"<= {GOAL_READS} reads",
        reads <= GOAL_READS and status == "SUCCEEDED",
        f"the real KineticJobTrigger against the Kubernetes API double, {waited:g} fake "
        f"seconds; event {status}; requests: "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
    )
