"""Where checkpoints live: one slot per task run (never per try), per batch input, per
host; the env a job gets; the start record; attempts claimed once each; cleanup."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_kinetic.core.jobs import checkpoint as ck
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.template import JobTemplate
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.runner.resume import claim_attempt

TASK = {"dag_id": "d", "run_id": "manual__1", "task_id": "t", "map_index": -1, "try_number": 1}


def test_the_slot_is_per_task_run_not_per_try_or_job():
    first = ck.checkpoint_key(TASK, "job-aaaa")
    assert first == "checkpoints/tasks/d/manual__1/t/-1/job/"
    # Another try, another job id (a preemption resubmit): the same slot.
    assert ck.checkpoint_key({**TASK, "try_number": 3}, "job-bbbb") == first
    # Another run, task or map index: another slot.
    others = [{**TASK, "run_id": "manual__2"}, {**TASK, "task_id": "u"}, {**TASK, "map_index": 0}]
    assert len({first, *(ck.checkpoint_key(i, "job-aaaa") for i in others)}) == 4


def test_batch_children_each_have_their_own_slot_under_the_task():
    slots = [ck.checkpoint_key(TASK, f"job-{i}", index=i) for i in range(3)]
    assert len(set(slots)) == 3 and ck.checkpoint_key(TASK, "job-x") not in slots
    assert all(s.startswith(ck.task_checkpoints_key(TASK)) for s in slots)
    assert slots[2] == "checkpoints/tasks/d/manual__1/t/-1/inputs/2/"


def test_ids_that_differ_only_in_unsafe_characters_get_different_slots():
    keys = {ck.checkpoint_key({**TASK, "run_id": r}, "j") for r in ("a:1", "a+1", "a~1", "a_1")}
    assert len(keys) == 4 and all(".." not in k for k in keys)


def test_a_job_without_task_ids_keeps_its_checkpoints_per_job():
    assert ck.checkpoint_key({}, "job-1") == "checkpoints/jobs/job-1/job/"
    assert ck.checkpoint_key({}, "job-1") != ck.checkpoint_key({}, "job-2")
    assert ck.host_key("checkpoints/jobs/job-1/job/", 3) == "checkpoints/jobs/job-1/job/host-3/"


def test_env_names_the_slot_and_the_interval_only_when_not_the_default(tmp_path):
    store = LocalStore(str(tmp_path))
    env = ck.checkpoint_env(store, TASK, "job-1")
    assert env == {ck.CHECKPOINT_URI_ENV: store.uri("checkpoints/tasks/d/manual__1/t/-1/job/")}
    env = ck.checkpoint_env(store, TASK, "job-1", index=4, sync_s=0.5)
    assert env[ck.SYNC_S_ENV] == "0.5" and env[ck.CHECKPOINT_URI_ENV].rstrip("/").endswith(
        "/inputs/4"
    )


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "soon", None])
def test_the_sync_interval_must_be_positive(bad):
    with pytest.raises(ValueError, match="checkpoint_sync_s must be a positive number"):
        JobOptions(checkpoint_sync_s=bad)
    assert JobRequest(func=len).options.checkpoint_sync_s == ck.DEFAULT_SYNC_S == 60.0
    assert JobOptions(checkpoint_sync_s="2.5").checkpoint_sync_s == 2.5


def test_the_template_gives_each_job_and_child_its_slot(tmp_path):
    from airflow_provider_kinetic.core.config import KineticConfig

    config = KineticConfig(backend="local", root=str(tmp_path))
    store = config.store()
    template = JobTemplate(
        backend="local", func_name="f", payload_uri="file:///p",
        payload_sha256="0" * 64, context_uri="file:///c", context_sha256="1" * 64,
        output_dir=store.uri("out"), identity=dict(TASK), options=JobOptions(checkpoint_sync_s=2.0),
    )  # fmt: skip
    single = template.spec(config, store, "job-1").env
    children = [template.spec(config, store, f"job-c{i}", index=i).env for i in (0, 1)]
    uris = [e[ck.CHECKPOINT_URI_ENV] for e in (single, *children)]
    assert len(set(uris)) == 3 and uris[0] == store.uri(ck.checkpoint_key(TASK, "job-1"))
    assert all(e[ck.SYNC_S_ENV] == "2.0" for e in (single, *children))
    # The wire form keeps the interval (a batch carries its template across deferrals).
    assert JobTemplate.from_dict(template.to_dict()).options.checkpoint_sync_s == 2.0


def test_remove_checkpoints_deletes_the_task_runs_slots_only(tmp_path):
    store = LocalStore(str(tmp_path))
    other = {**TASK, "task_id": "t2"}
    for identity, index in ((TASK, None), (TASK, 0), (other, None)):
        store.write_bytes(ck.checkpoint_key(identity, "j", index) + "host-0/manifest.json", b"{}")
    assert ck.remove_checkpoints(store, TASK) == 2
    assert store.list("checkpoints/") == [ck.checkpoint_key(other, "j") + "host-0/manifest.json"]
    assert ck.remove_checkpoints(store, {}) == 0  # no task ids: nothing is the task's


def test_start_record_round_trip(tmp_path):
    store = LocalStore(str(tmp_path))
    assert ck.read_started(store, "job-1") is None
    store.write_bytes(ck.started_key("job-1"), ck.started_record(1700000000.5, 0, 3))
    assert store.exists("job-1/started.json")
    assert ck.read_started(store, "job-1/") == {"started_at": 1700000000.5, "host": 0, "attempt": 3}


def test_attempts_are_claimed_once_each_even_when_starts_race(tmp_path):
    store = LocalStore(str(tmp_path))
    prefix = ck.host_key(ck.checkpoint_key(TASK, "j"), 0)
    assert claim_attempt(store, prefix, b"{}") == 1
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda: got.append(claim_attempt(store, prefix, b"{}")))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(2, 10))
    assert ck.attempts_in(store.list(prefix + "attempts/"), prefix) == list(range(1, 10))


def test_stale_checkpoints_are_the_slots_nobody_wrote_for_the_retention(tmp_path):
    import os
    import time

    store = LocalStore(str(tmp_path))
    old = {"dag_id": "d", "run_id": "r1", "task_id": "t", "map_index": -1}
    new = {**old, "run_id": "r2"}
    old_key = ck.checkpoint_key(old, "job-00000001")
    new_key = ck.checkpoint_key(new, "job-00000002")
    plain_key = ck.checkpoint_key({}, "job-00000003")
    for key in (old_key, new_key, plain_key):
        store.write_bytes(key + "host-0/manifest.json", b"{}")
        store.write_bytes(key + "host-0/files/1-1/w.npz", b"x" * 10)
    now = time.time()
    week_ago = now - 8 * 86400
    for key in (old_key, plain_key):
        for name in ("host-0/manifest.json", "host-0/files/1-1/w.npz"):
            path = os.path.join(str(tmp_path), key + name)
            os.utime(path, (week_ago, week_ago))
    stale = ck.stale_checkpoints(store, 7 * 86400, now)
    assert stale == sorted(
        [(ck.task_checkpoints_key(old), 2, 12), ("checkpoints/jobs/job-00000003/", 2, 12)]
    )
    assert ck.stale_checkpoints(store, 9 * 86400, now) == []
