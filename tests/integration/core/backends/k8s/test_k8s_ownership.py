"""Ownership of a job's Kubernetes objects is proven, not named; a lost create keeps its Secret.

The real ``kubernetes`` (in a thread) and ``kubernetes_asyncio`` clients talk to the
loopback API double.  Another party's Job or LeaderWorkerSet of the job's name (even
one with a copy of our labels: they are predictable) is never adopted, patched or
deleted; a create whose answers were all lost is settled by reading the object back,
and the job's Secret then belongs to the Job (``ownerReferences``) instead of being
deleted from under it.  A Secret of the job's name that a restarted driver meets is
adopted when proven ours, and another party's is named and left alone.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import urllib3

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend
from airflow_provider_kinetic.core.backends.k8s.jobset import JobSetBackend
from airflow_provider_kinetic.core.backends.k8s.manifests import (
    job_manifest,
    jobset_manifest,
    jobset_name,
    lws_manifest,
)
from airflow_provider_kinetic.core.backends.k8s.ownership import (
    OWNER_LABEL,
    OwnershipConflict,
    owner_token,
)
from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend
from airflow_provider_kinetic.core.backends.k8s.retry import RetryPolicy
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.jobs.signing import Keyring
from airflow_provider_kinetic.core.jobs.submit import create_job
from airflow_provider_kinetic.core.spec.handles import artifact_key
from airflow_provider_kinetic.core.spec.pod import (
    JobSpec,
    SpecInputs,
    build_job_spec,
    secret_name,
)
from airflow_provider_kinetic.core.storage.local import LocalStore
from tests.fixtures import records
from tests.fixtures.k8s_double import K8sDouble, by_code_under_test, running_double, to_json

NS = "default"
JOB_ID = "job-0000cafe"
JOB = f"kinetic-{JOB_ID}"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
JOB_PATH = f"{JOBS}/{JOB}"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SECRET_PATH = f"{SECRETS}/{JOB}-secrets"
LWS = f"keras-pathways-{JOB_ID}"
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
HANDLE = records.handle(JOB_ID, "b", "gke", namespace=NS, k8s_name=JOB)
LWS_HANDLE = records.handle(JOB_ID, "b", "pathways", namespace=NS, k8s_name=LWS)
SECRET = b"deployment-secret-0123456789abcdef"
MODES = ["sync", "async"]


@pytest.fixture
async def api() -> AsyncIterator[K8sDouble]:
    async with running_double() as double:
        yield double


def make_spec(accelerator: str = "cpu") -> JobSpec:
    bucket = "proj-kn-c1-jobs"
    return build_job_spec(
        SpecInputs(
            job_id=JOB_ID, bucket=bucket, accelerator=parse_accelerator(accelerator),
            context_uri=f"gs://{bucket}/{JOB_ID}/context.zip",
            payload_uri=f"gs://{bucket}/{JOB_ID}/payload.pkl",
            result_uri=f"gs://{bucket}/{JOB_ID}/result.pkl",
            payload_sha256="a" * 64, context_sha256="b" * 64, image="img:1",
            output_dir=f"gs://{bucket}/outputs/", identity={"dag_id": "d", "task_id": "t"},
            secrets={"KINETIC_RESULT_KEY": "ab" * 32},
        )
    )  # fmt: skip


def backend_of(api: K8sDouble, cls: type[GkeBackend] = GkeBackend) -> GkeBackend:
    async def asleep(seconds: float) -> None:
        del seconds

    backend = cls(api.client_factory())
    backend.retry_policy = RetryPolicy(attempts=3, sleep=lambda s: None, asleep=asleep)
    backend.owner_secret = Keyring([SECRET])
    return backend


async def submit(mode: str, backend: GkeBackend, spec: JobSpec) -> None:
    if mode == "sync":
        await asyncio.to_thread(backend.submit, spec)
    else:
        await backend._arun(backend._submit_plan(spec))


async def cancel(mode: str, backend: GkeBackend, handle: Any) -> None:
    if mode == "sync":
        await asyncio.to_thread(backend.cancel, handle)
    else:
        await backend.acancel(handle)


def sent(api: K8sDouble, method: str, path: str = "") -> list[Any]:
    return by_code_under_test(api.sent(method, path))


async def read(api: K8sDouble, path: str) -> dict[str, Any] | None:
    resp = await api.get(path)
    return None if resp.status == 404 else await resp.json()


def squatter_job() -> dict[str, Any]:
    """Someone else's Job of our name, with a copy of every label we would send but
    the owner token (which only the deployment secret makes)."""
    return to_json(job_manifest(make_spec()))


# ---- someone else's object of the job's name -------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_foreign_job_of_the_name_fails_the_create_and_is_left_alone(
    api: K8sDouble, mode: str, tmp_path: Path
) -> None:
    """The real submission path: the 409 is not "exists, keep it"; the foreign Job and
    its labels are named, nothing of it is deleted or patched."""
    foreign = await api.create(JOBS, squatter_job())
    backend = backend_of(api)
    store = LocalStore(str(tmp_path))
    spec = make_spec()
    if mode == "sync":
        with pytest.raises(OwnershipConflict) as info:
            await asyncio.to_thread(create_job, store, backend, spec, HANDLE)
    else:
        with pytest.raises(OwnershipConflict) as info:
            await submit(mode, backend, spec)
        assert not await asyncio.to_thread(backend.exists, HANDLE)
    message = str(info.value)
    assert info.value.status == 409
    assert f"Job {NS}/{JOB} already exists and is not this job's" in message
    assert f"{OWNER_LABEL} label does not prove" in message
    assert '"job-id": "job-0000cafe"' in message  # whose labels: the object's own
    after = await read(api, JOB_PATH)
    assert after is not None and after["metadata"]["uid"] == foreign["metadata"]["uid"]
    assert sent(api, "DELETE", JOBS) == [] and sent(api, "PATCH", JOBS) == []
    if mode == "sync":  # create_job removed the job's artifacts: nothing looks like a job
        assert not store.exists(artifact_key(JOB_ID, "handle.json"))


async def test_a_foreign_job_met_after_a_5xx_is_not_adopted_by_its_labels(api: K8sDouble) -> None:
    """A 503 that did not create our Job, then a 409 for a look-alike: not taken as ours."""
    foreign = await api.create(JOBS, squatter_job())
    backend = backend_of(api)
    api.fail("POST", JOBS, 503)
    with pytest.raises(OwnershipConflict):
        await asyncio.to_thread(backend.submit, make_spec())
    assert sent(api, "PATCH", SECRETS) == []  # the foreign Job was never made the Secret's owner
    after = await read(api, JOB_PATH)
    assert after is not None and after["metadata"]["uid"] == foreign["metadata"]["uid"]
    assert sent(api, "DELETE", JOBS) == []
    # Our own Secret (by the uid its create answered) does not stay to feed that Job.
    (delete,) = sent(api, "DELETE", SECRETS)
    assert await read(api, SECRET_PATH) is None
    assert json.loads(delete.body)["preconditions"]["uid"]


async def test_a_foreign_secret_of_the_name_is_left_alone(api: K8sDouble) -> None:
    """A look-alike Secret (our labels copied, no owner token) is not adopted after a
    lost create: no Job is made to use it, nothing of it is patched or deleted."""
    labels = make_spec().labels
    meta = {"name": f"{JOB}-secrets", "labels": dict(labels)}
    foreign = await api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": meta})
    backend = backend_of(api)
    api.fail("POST", SECRETS, 503)  # a retry meets the foreign Secret: a 409, not adopted
    with pytest.raises(Exception, match="HTTP 409"):
        await asyncio.to_thread(backend.submit, make_spec())
    assert sent(api, "DELETE") == [] and sent(api, "POST", JOBS) == []
    assert sent(api, "PATCH") == []
    after = await read(api, SECRET_PATH)
    assert after is not None and after["metadata"]["uid"] == foreign["metadata"]["uid"]


# ---- a Secret of the job's name met by a restarted driver -------------------------------------


def secret_body(labels: dict[str, str], owners: list[dict[str, Any]] | None = None) -> dict:
    meta: dict[str, Any] = {"name": f"{JOB}-secrets", "labels": labels}
    if owners is not None:
        meta["ownerReferences"] = owners
    data = {"KINETIC_RESULT_KEY": "ab" * 32}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": data}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("owned", ["unowned", "owned-by-our-job"])
async def test_our_secret_left_by_a_restarted_driver_is_adopted(
    api: K8sDouble, mode: str, owned: str
) -> None:
    """A driver created the Secret (stamped with the owner token) and died, before its
    Job's create or after it and the Secret's ``ownerReferences`` patch.  The next
    driver's Secret create answers 409 on a fresh call: the Secret is read back, proven
    ours by its labels and token (and an owner that is our Job, when it has one), and
    adopted; the Job is made (or proven ours) and owns it.  Nothing is deleted."""
    labels = {**make_spec().labels, OWNER_LABEL: owner_token(SECRET, NS, JOB)}
    owners = None
    if owned == "owned-by-our-job":
        body = to_json(job_manifest(make_spec()))
        body["metadata"]["labels"][OWNER_LABEL] = owner_token(SECRET, NS, JOB)
        job = await api.create(JOBS, body)  # the earlier driver's, proven ours
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": JOB,
               "uid": job["metadata"]["uid"], "blockOwnerDeletion": False}  # fmt: skip
        owners = [ref]
    left = await api.create(SECRETS, secret_body(labels, owners))
    backend = backend_of(api)
    await submit(mode, backend, make_spec())
    job = await read(api, JOB_PATH)
    secret = await read(api, SECRET_PATH)
    assert job is not None and secret is not None
    assert secret["metadata"]["uid"] == left["metadata"]["uid"]  # the same Secret, adopted
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", JOB, job["metadata"]["uid"])
    assert sent(api, "DELETE") == []


async def test_our_secret_owned_by_our_leaderworkerset_is_adopted(api: K8sDouble) -> None:
    """The same on the Pathways backend: the Secret's owner is our LeaderWorkerSet."""
    spec = make_spec("tpu-v6e-2x4")
    body = to_json(lws_manifest(spec))
    body["metadata"]["labels"][OWNER_LABEL] = owner_token(SECRET, NS, LWS)
    lws = await api.create(LWS_PATH, body)
    ref = {"apiVersion": body["apiVersion"], "kind": "LeaderWorkerSet", "name": LWS,
           "uid": lws["metadata"]["uid"], "blockOwnerDeletion": False}  # fmt: skip
    labels = {**spec.labels, OWNER_LABEL: owner_token(SECRET, NS, LWS)}
    left = await api.create(SECRETS, secret_body(labels, [ref]))
    await asyncio.to_thread(backend_of(api, PathwaysBackend).submit, spec)
    secret = await read(api, SECRET_PATH)
    assert secret is not None and secret["metadata"]["uid"] == left["metadata"]["uid"]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("LeaderWorkerSet", lws["metadata"]["uid"])
    assert sent(api, "DELETE") == []


@pytest.mark.parametrize(
    "stranger", ["no-token", "wrong-token", "other-labels", "owned-by-another-object"]
)
async def test_a_strangers_secret_of_the_name_fails_the_submit_and_is_left_alone(
    api: K8sDouble, stranger: str
) -> None:
    """A fresh Secret create (no earlier attempt of this call) answers 409 for a Secret
    that is not proven ours: the submit fails naming it and its labels, no Job is made
    to use it, and nothing of it is patched or deleted."""
    labels = dict(make_spec().labels)
    owners = None
    if stranger == "wrong-token":
        labels[OWNER_LABEL] = owner_token(b"someone-elses-secret", NS, JOB)
    elif stranger == "other-labels":
        labels = {**labels, OWNER_LABEL: owner_token(SECRET, NS, JOB), "job-id": "job-0000beef"}
    elif stranger == "owned-by-another-object":
        labels[OWNER_LABEL] = owner_token(SECRET, NS, JOB)
        owners = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "theirs",
                   "uid": "0000-their-uid", "blockOwnerDeletion": False}]  # fmt: skip
    foreign = await api.create(SECRETS, secret_body(labels, owners))
    backend = backend_of(api)
    with pytest.raises(OwnershipConflict) as info:
        await asyncio.to_thread(backend.submit, make_spec())
    message = str(info.value)
    assert info.value.status == 409
    assert f"Secret {NS}/{JOB}-secrets already exists and is not this job's" in message
    assert sent(api, "POST", JOBS) == []
    assert sent(api, "DELETE") == [] and sent(api, "PATCH") == []
    after = await read(api, SECRET_PATH)
    assert after is not None and after["metadata"]["uid"] == foreign["metadata"]["uid"]
    assert after["metadata"]["labels"] == foreign["metadata"]["labels"]
    assert after["metadata"].get("ownerReferences") == foreign["metadata"].get("ownerReferences")


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_leaves_someone_elses_job_alone(api: K8sDouble, mode: str) -> None:
    await api.create(JOBS, squatter_job())
    backend = backend_of(api)
    await cancel(mode, backend, HANDLE)
    assert sent(api, "DELETE") == []
    assert await read(api, JOB_PATH) is not None
    assert not await asyncio.to_thread(backend.exists, HANDLE)


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_leaves_someone_elses_leaderworkerset_alone(api: K8sDouble, mode: str) -> None:
    await api.create(LWS_PATH, to_json(lws_manifest(make_spec("tpu-v6e-2x4"))))
    backend = backend_of(api, PathwaysBackend)
    await cancel(mode, backend, LWS_HANDLE)
    assert sent(api, "DELETE") == []
    assert await read(api, f"{LWS_PATH}/{LWS}") is not None


@pytest.mark.parametrize("mode", MODES)
async def test_a_jobset_is_ours_by_its_token_and_only_ours_is_cancelled(
    api: K8sDouble, mode: str
) -> None:
    """A multi-slice job's JobSet: a stranger's of the name is left alone; ours (its
    Secret owned by it) is proven by its token and deleted by its uid."""
    spec = dataclasses.replace(make_spec("tpu-v5p-2x2x2"), num_slices=2)
    name = jobset_name(JOB_ID)
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
    handle = records.handle(JOB_ID, "b", "jobset", namespace=NS, k8s_name=name)
    backend = backend_of(api, JobSetBackend)
    await api.create(path, to_json(jobset_manifest(spec)))  # no owner token: a stranger's
    await cancel(mode, backend, handle)
    assert sent(api, "DELETE") == [] and await read(api, f"{path}/{name}") is not None
    await api.delete(f"{path}/{name}")

    await submit(mode, backend, spec)
    jobset = await read(api, f"{path}/{name}")
    assert jobset is not None
    assert jobset["metadata"]["labels"][OWNER_LABEL] == owner_token(SECRET, NS, name)
    secret = await read(api, f"/api/v1/namespaces/{NS}/secrets/{secret_name(JOB_ID)}")
    assert secret is not None
    (ref,) = secret["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"]) == ("JobSet", name)
    assert await asyncio.to_thread(backend.exists, handle)
    await cancel(mode, backend, handle)
    (delete,) = sent(api, "DELETE", f"{path}/{name}")
    assert json.loads(delete.body)["preconditions"] == {"uid": jobset["metadata"]["uid"]}
    assert await read(api, f"{path}/{name}") is None


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_deletes_our_own_job_by_its_uid(api: K8sDouble, mode: str) -> None:
    backend = backend_of(api)
    await submit(mode, backend, make_spec())
    job = await read(api, JOB_PATH)
    assert job is not None and job["metadata"]["labels"][OWNER_LABEL] == owner_token(
        SECRET, NS, JOB
    )
    assert await asyncio.to_thread(backend.exists, HANDLE)
    await cancel(mode, backend, HANDLE)
    (delete,) = sent(api, "DELETE", JOB_PATH)
    assert json.loads(delete.body)["preconditions"] == {"uid": job["metadata"]["uid"]}
    assert delete.params["propagationPolicy"] == "Foreground"
    assert await read(api, JOB_PATH) is None


async def test_a_job_replaced_after_the_ownership_read_is_not_deleted(api: K8sDouble) -> None:
    """The delete carries the uid that was proven: a Job made in its place meanwhile
    (same name, new uid) makes the API server answer 409, and it stays."""
    backend = backend_of(api)
    await asyncio.to_thread(backend.submit, make_spec())
    plan = backend._cancel_plan(HANDLE)
    ours = await asyncio.to_thread(backend._send, next(plan))  # the ownership read
    delete = plan.send(ours)
    await api.delete(JOB_PATH)  # gone and made again in between, by the same code
    replaced = to_json(copy.deepcopy(json.loads(ours.body)))
    del replaced["metadata"]["uid"]
    newer = await api.create(JOBS, replaced)
    with pytest.raises(StopIteration):
        plan.send(await asyncio.to_thread(backend._send, delete))
    after = await read(api, JOB_PATH)
    assert after is not None and after["metadata"]["uid"] == newer["metadata"]["uid"]


async def test_a_job_of_a_rotated_secret_is_still_ours(api: K8sDouble) -> None:
    backend = backend_of(api)
    await asyncio.to_thread(backend.submit, make_spec())
    backend.owner_secret = Keyring([b"the-new-secret", SECRET])  # rotated: the old one verifies
    assert await asyncio.to_thread(backend.exists, HANDLE)
    backend.owner_secret = Keyring([b"the-new-secret"])  # the old one dropped: not provable
    assert not await asyncio.to_thread(backend.exists, HANDLE)


# ---- a create whose answers were all lost ------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("last", ["reset", "503"])
async def test_a_create_with_every_answer_lost_keeps_the_job_and_its_secret(
    api: K8sDouble, mode: str, last: str
) -> None:
    """The first attempt created the Job and lost its answer; every later one lost its
    answer too (or the last was a 503).  The Job is read back, proven ours, and owns
    its Secret; nothing is deleted."""
    backend = backend_of(api)
    api.drop("POST", JOBS, apply=True)  # created, then the connection drops
    if last == "reset":
        api.drop("POST", JOBS, times=2)
    else:
        api.drop("POST", JOBS)
        api.fail("POST", JOBS, 503)
    await submit(mode, backend, make_spec())
    assert len(sent(api, "POST", JOBS)) == 3
    job = await read(api, JOB_PATH)
    secret = await read(api, SECRET_PATH)
    assert job is not None and secret is not None
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", JOB, job["metadata"]["uid"])
    assert sent(api, "DELETE") == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_create_that_never_happened_removes_its_secret(api: K8sDouble, mode: str) -> None:
    """Every answer lost and no Job of the name: the Secret goes (by its uid)."""
    backend = backend_of(api)
    api.drop("POST", JOBS, times=3)
    with pytest.raises((urllib3.exceptions.HTTPError, aiohttp.ClientError)):  # connection lost
        await submit(mode, backend, make_spec())
    assert await read(api, JOB_PATH) is None
    assert await read(api, SECRET_PATH) is None
    (delete,) = sent(api, "DELETE", SECRET_PATH)
    assert json.loads(delete.body)["preconditions"]["uid"]


async def test_cancel_deletes_our_job_whose_extra_labels_replace_app(api: K8sDouble) -> None:
    """A task's extra labels may set ``app``: the job is still proven ours (job-id + token)."""
    spec = make_spec()
    spec.labels["app"] = "team-x"  # as SpecInputs.extra_labels={"app": "team-x"} builds it
    backend = backend_of(api)
    await asyncio.to_thread(backend.submit, spec)
    await asyncio.to_thread(backend.cancel, HANDLE)
    assert len(sent(api, "DELETE", JOB_PATH)) == 1 and await read(api, JOB_PATH) is None
