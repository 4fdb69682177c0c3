"""Drives one batch the way a deferred ``KineticMapOperator`` does, in a fresh process:
``batch_child.py N MAX_CONCURRENT ROOT``.

The operator's part (plan, shared uploads, the sealed plan, the first
``max_concurrent`` launches), then the trigger's part with the trigger's own
``BatchDriver`` (poll, observe, launch, save deltas; one ``batch_status`` per poll),
the ``finished`` event serialised as the triggerer would, then the operator's
collection of every result.  Every child is a real runner under the local backend's
supervisor.  Airflow is not imported: the numbers are the batch code's, not Airflow's.

Prints one JSON line: wall seconds, the driver's CPU seconds, polls, every store
write (key -> count) and the bytes of each state save, and the peak RSS of this
process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), before and after the batch.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def main() -> int:
    n, max_concurrent, root = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    from cases_batch import CountingStore, add_one

    from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
    from airflow_provider_kinetic.core.batch import launch as batchlaunch
    from airflow_provider_kinetic.core.batch import manifest as batchmanifest
    from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
    from airflow_provider_kinetic.core.batch import run as batchrun
    from airflow_provider_kinetic.core.batch.plan import plan_batch
    from airflow_provider_kinetic.core.batch.resume import save_plan
    from airflow_provider_kinetic.core.batch.state import BatchState
    from airflow_provider_kinetic.core.config import KineticConfig
    from airflow_provider_kinetic.core.jobs.request import JobRequest
    from airflow_provider_kinetic.core.jobs.signing import ResultKey
    from airflow_provider_kinetic.triggers.batch_drive import BatchDriver, finished_event

    secret = os.urandom(32)
    store = CountingStore(str(root / "store"))
    store.sizes = {}  # type: ignore[attr-defined]
    real_write = store.write_bytes

    def write_bytes(key, data, **kwargs):  # type: ignore[no-untyped-def]
        store.sizes[key] = store.sizes.get(key, 0) + len(data)  # type: ignore[attr-defined]
        return real_write(key, data, **kwargs)

    store.write_bytes = write_bytes  # type: ignore[method-assign]
    config = KineticConfig(backend="local", root=store.bucket)
    backend = LocalBackend(store.bucket, max_jobs=max_concurrent)
    rss_before = rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    # The operator: plan, upload once, seal the plan, launch the first children, defer.
    state, objects, local = plan_batch(
        JobRequest(func=add_one, output_dir=store.uri("outputs/bench")),
        list(range(n)), "single", store, config=config, max_concurrent=max_concurrent,
        retries=0, fail_fast=False, signing_secret=secret,
    )  # fmt: skip
    batchlaunch.start_batch(state, objects, local, store)
    save_plan(store, state, secret)
    batchlaunch.launch(state, config, backend, store, secret)
    batchmanifest.maybe_write_manifest(state, store)
    state.driver, state.seq = uuid.uuid4().hex, 0
    kwargs = json.dumps(state.to_dict())  # the trigger's kwargs, serialised once
    # The trigger: its driver from the kwargs, one batch_status per poll.
    batch = BatchState.from_dict(json.loads(kwargs))
    driver = BatchDriver(
        config, store, secret, backend, logging.getLogger("bench"),
        lambda h: ResultKey.for_job(secret, h.job_id, h.result_key_id),
    )  # fmt: skip
    batch = driver.resume(batch)
    polls, deadline = 0, time.monotonic() + float(os.environ.get("BATCH_TIMEOUT_S", "7200"))
    while True:
        handles = list(batch.active.values())
        reports = backend.batch_status(batch.group_id, handles) if handles else {}
        polls += 1
        driver.step(batch, reports)
        if batch.finished:
            driver.save(batch)
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch did not finish: {batchrun.counts(batch)}")
        backend.wait(list(batch.active.values()), 1.0)
    event = json.dumps(finished_event(batch))
    # The operator resumed: collect every result from the event's state.
    done = BatchState.from_dict(json.loads(event)["state"])
    values, failures = batchoutcomes.gather(
        done, store, result_key=lambda job: ResultKey.for_job(secret, job)
    )
    wall = time.perf_counter() - start
    state_keys = [k for k in store.writes if "/driven" in k or k.endswith("/live.json")]
    print(
        json.dumps(
            {
                "n": n,
                "wall": wall,
                "cpu": time.process_time() - cpu,
                "polls": polls,
                "writes": len(store.writes),
                "shared": {k: store.writes.count(k) for k in objects},
                "state_saves": len(state_keys),
                "state_bytes": sum(store.sizes[k] for k in set(state_keys)),
                "max_state_save": max((store.sizes[k] for k in set(state_keys)), default=0),
                "event_bytes": len(event),
                "kwargs_bytes": len(kwargs),
                "correct": not failures and values == [i + 1 for i in range(n)],
                "rss_before_mb": rss_before,
                "rss_peak_mb": rss_mb(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
