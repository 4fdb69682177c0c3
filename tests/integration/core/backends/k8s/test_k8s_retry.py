"""Transient Kubernetes API failures are retried; lost creates are not repeated into duplicates.

The real ``kubernetes`` (in a thread) and ``kubernetes_asyncio`` clients talk to the
loopback API double, which is told to answer 503 / 429 or drop the connection for
the next N matching requests (``K8sDouble.fail`` / ``drop``).  The retry policy's
``sleep`` records each backoff instead of waiting, so the tests wait for nothing and
can assert the waits (a ``Retry-After`` is honoured, the backoff stays in bounds).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from airflow_provider_kinetic.core.backends.k8s.gke import GkeBackend, KubernetesApiError
from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest
from airflow_provider_kinetic.core.backends.k8s.pathways import PathwaysBackend
from airflow_provider_kinetic.core.backends.k8s.retry import RetryPolicy, retry_after_s
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.config import KineticConfig, KineticConfigError
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.core.spec.pod import JobSpec, SpecInputs, build_job_spec
from airflow_provider_kinetic.hooks.kinetic import backend_for as hook_backend_for
from tests.fixtures import records
from tests.fixtures.google_creds import FakeCredentials
from tests.fixtures.k8s_double import (
    K8sDouble,
    by_code_under_test,
    forget_log_cursors,
    to_json,
)

NS = "default"
JOB_ID = "job-0000beef"
JOB = f"kinetic-{JOB_ID}"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
JOB_PATH = f"{JOBS}/{JOB}"
POD = f"{JOB}-p0d"
PODS = f"/api/v1/namespaces/{NS}/pods"
LWS = f"keras-pathways-{JOB_ID}"
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
HANDLE = records.handle(JOB_ID, "b", "gke", namespace=NS, k8s_name=JOB)
LWS_HANDLE = records.handle(JOB_ID, "b", "pathways", namespace=NS, k8s_name=LWS)
MODES = ["sync", "async"]


@pytest.fixture(autouse=True)
def _fresh_log_cursors() -> None:
    forget_log_cursors()


class Waits(list):
    """A RetryPolicy whose sleeps are recorded here instead of slept."""

    def policy(self, attempts: int = 5, **kwargs: Any) -> RetryPolicy:
        async def asleep(seconds: float) -> None:
            self.append(seconds)

        return RetryPolicy(
            attempts=attempts,
            wait_initial_s=0.05,
            wait_max_s=0.4,
            sleep=self.append,
            asleep=asleep,
            **kwargs,
        )


def make_spec(accelerator: str = "gpu:l4") -> JobSpec:
    bucket = "proj-kn-c1-jobs"
    return build_job_spec(
        SpecInputs(
            job_id=JOB_ID,
            bucket=bucket,
            accelerator=parse_accelerator(accelerator),
            context_uri=f"gs://{bucket}/{JOB_ID}/context.zip",
            payload_uri=f"gs://{bucket}/{JOB_ID}/payload.pkl",
            result_uri=f"gs://{bucket}/{JOB_ID}/result.pkl",
            payload_sha256="a" * 64,
            context_sha256="b" * 64,
            image="us-docker.pkg.dev/proj/kn-c1/base:gpu-0123456789ab",
            output_dir=f"gs://{bucket}/outputs/",
            identity={"dag_id": "d", "task_id": "t"},
        )
    )


def backend_with(api: K8sDouble, waits: Waits, cls: type[GkeBackend] = GkeBackend, **kw: Any):
    backend = cls(api.client_factory())
    backend.retry_policy = waits.policy(**kw)
    return backend


async def run(mode: str, backend: GkeBackend, op: str, *args: Any) -> Any:
    """``backend.<op>(*args)`` through the sync client (in a thread) or the async one.

    The async create goes through the same async driver the triggers use."""
    if mode == "sync":
        return await asyncio.to_thread(getattr(backend, op), *args)
    if op == "submit":
        return await backend._arun(backend._submit_plan(*args))
    return await getattr(backend, f"a{op}" if op != "cancel" else "acancel")(*args)


async def add_job(api: K8sDouble, **status: Any) -> None:
    await api.create(JOBS, to_json(job_manifest(make_spec())))
    if status:
        await api.patch_status(JOB_PATH, status)


async def add_running_pod(api: K8sDouble, *lines: str) -> None:
    meta = {"name": POD, "labels": {"job-name": JOB}}
    await api.create(PODS, {"metadata": meta, "spec": {"containers": [{"name": "kinetic-worker"}]}})
    running = [{"name": "kinetic-worker", "state": {"running": {}}}]
    await api.patch_status(f"{PODS}/{POD}", {"phase": "Running", "containerStatuses": running})
    api.write_log(NS, POD, *lines)


def jobs_in(api: K8sDouble) -> list[str]:
    return [name for (res, ns, name) in api.objects if "jobs" in str(res) and ns == NS]


def sent(api: K8sDouble, method: str, path: str) -> list[Any]:
    """Requests of the code under test to exactly ``path`` (no sub-paths)."""
    return [r for r in by_code_under_test(api.sent(method, path)) if r.url.path == path]


# ---- 503 twice, then the answer: every operation, both clients -------------------------------


Check = Callable[[K8sDouble, Any], Awaitable[None]]


async def _prepare_create(api: K8sDouble) -> tuple[str, str, tuple[Any, ...], Check]:
    async def check(api: K8sDouble, result: Any) -> None:
        assert jobs_in(api) == [JOB]  # created once, by the third attempt

    return "POST", JOBS, (make_spec(),), check


async def _prepare_status(api: K8sDouble) -> tuple[str, str, tuple[Any, ...], Check]:
    await add_job(api, succeeded=1)

    async def check(api: K8sDouble, result: Any) -> None:
        assert result.status is JobStatus.SUCCEEDED

    return "GET", JOB_PATH, (HANDLE,), check


async def _prepare_logs(api: K8sDouble) -> tuple[str, str, tuple[Any, ...], Check]:
    await add_job(api)
    await add_running_pod(api, "epoch 1", "epoch 2")

    async def check(api: K8sDouble, result: Any) -> None:
        assert result == ("epoch 1\nepoch 2\n", 2)

    return "GET", f"{PODS}/{POD}/log", (HANDLE, 0), check


async def _prepare_cancel(api: K8sDouble) -> tuple[str, str, tuple[Any, ...], Check]:
    await add_job(api)

    async def check(api: K8sDouble, result: Any) -> None:
        assert jobs_in(api) == [] or all(api.objects[k].deleted for k in api.objects)

    return "DELETE", JOB_PATH, (HANDLE,), check


PREPARE = {
    "submit": _prepare_create,
    "status": _prepare_status,
    "read_logs": _prepare_logs,
    "cancel": _prepare_cancel,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", list(PREPARE))
async def test_503_twice_then_the_answer(api: K8sDouble, op: str, mode: str) -> None:
    waits = Waits()
    backend = backend_with(api, waits)
    method, path, args, check = await PREPARE[op](api)
    api.forget_requests()
    fault = api.fail(method, path, 503, times=2)
    result = await run(mode, backend, op, *args)
    await check(api, result)
    assert fault.hits == 2 and len(sent(api, method, path)) == 3
    assert len(waits) == 2 and all(0 < w <= 0.4 for w in waits), waits


@pytest.mark.parametrize("mode", MODES)
async def test_dropped_connections_are_retried(api: K8sDouble, mode: str) -> None:
    waits = Waits()
    backend = backend_with(api, waits)
    await add_job(api, succeeded=1)
    api.forget_requests()
    api.drop("GET", JOB_PATH, times=2)
    assert (await run(mode, backend, "status", HANDLE)).status is JobStatus.SUCCEEDED
    assert len(sent(api, "GET", JOB_PATH)) == 3


# ---- 429 with Retry-After ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("header", "waited"), [("2", 2.0), ("120", 7.5)])
async def test_429_waits_what_retry_after_asks(
    api: K8sDouble, mode: str, header: str, waited: float
) -> None:
    """The wait is the server's (capped by ``retry_after_max_s``), not the backoff's."""
    waits = Waits()
    backend = backend_with(api, waits, retry_after_max_s=7.5)
    await add_job(api, succeeded=1)
    api.forget_requests()
    api.fail("GET", JOB_PATH, 429, retry_after=header)
    assert (await run(mode, backend, "status", HANDLE)).status is JobStatus.SUCCEEDED
    assert waits == [waited] and len(sent(api, "GET", JOB_PATH)) == 2


def test_retry_after_forms() -> None:
    assert retry_after_s("3") == 3.0 and retry_after_s(" 0.5 ") == 0.5
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert retry_after_s("soon") is None and retry_after_s(None) is None


# ---- the budget runs out -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["status", "cancel"])
async def test_a_server_that_keeps_failing_surfaces_after_the_budget(
    api: K8sDouble, mode: str, op: str
) -> None:
    waits = Waits()
    backend = backend_with(api, waits, attempts=4)
    await add_job(api)
    api.forget_requests()
    method = "GET" if op == "status" else "DELETE"
    api.fail(method, JOB_PATH, 503, times=1000)
    with pytest.raises(KubernetesApiError) as info:
        await run(mode, backend, op, HANDLE)
    assert info.value.status == 503
    assert "HTTP 503" in str(info.value) and "gave up after 4 attempts" in str(info.value)
    assert JOB in str(info.value)  # names what was being done
    assert len(sent(api, method, JOB_PATH)) == 4 and len(waits) == 3
    # exponential: each wait at least the one before it (less its jitter), all capped
    assert all(w <= 0.4 for w in waits) and waits[-1] >= 0.2, waits


@pytest.mark.parametrize("mode", MODES)
async def test_lost_connections_surface_after_the_budget(api: K8sDouble, mode: str) -> None:
    waits = Waits()
    backend = backend_with(api, waits, attempts=2)
    api.drop("POST", JOBS, times=1000)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the client's own connection error
        await run(mode, backend, "submit", make_spec())
    assert not isinstance(info.value, KubernetesApiError)
    assert len(sent(api, "POST", JOBS)) == 2 and len(waits) == 1
    assert jobs_in(api) == []


async def test_other_errors_are_not_retried(api: K8sDouble) -> None:
    waits = Waits()
    backend = backend_with(api, waits)
    api.fail("GET", JOB_PATH, 403)
    with pytest.raises(KubernetesApiError) as info:
        await backend.astatus(HANDLE)
    assert info.value.status == 403 and waits == []
    assert len(sent(api, "GET", JOB_PATH)) == 1


async def test_a_401_still_renews_the_client_once(api: K8sDouble) -> None:
    """401 -> fresh credentials at once (no backoff), then a 503 is retried as usual."""
    await add_job(api, succeeded=1)
    api.revoked_tokens.add("expired")
    waits = Waits()
    factory = api.client_factory("expired", "fresh")
    backend = GkeBackend(factory)
    backend.retry_policy = waits.policy()
    api.forget_requests()
    api.fail("GET", JOB_PATH, 503)
    status = await asyncio.to_thread(backend.status, HANDLE)
    assert status.status is JobStatus.SUCCEEDED and factory.calls == ["expired", "fresh"]
    auths = [r.headers["Authorization"] for r in sent(api, "GET", JOB_PATH)]
    assert auths == ["Bearer expired", "Bearer fresh", "Bearer fresh"] and len(waits) == 1


# ---- a create whose answer was lost is not repeated ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lost", ["503", "reset"])
async def test_create_that_happened_despite_the_error_is_not_repeated(
    api: K8sDouble, mode: str, lost: str
) -> None:
    waits = Waits()
    backend = backend_with(api, waits)
    if lost == "503":
        api.fail("POST", JOBS, 503, apply=True)  # the Job is created, the answer is a 503
    else:
        api.drop("POST", JOBS, apply=True)  # created, then the connection drops
    await run(mode, backend, "submit", make_spec())
    assert jobs_in(api) == [JOB]
    posts = sent(api, "POST", JOBS)
    assert len(posts) == 2  # the retry met 409 AlreadyExists ...
    assert len(sent(api, "GET", JOB_PATH)) == 1  # ... and read the Job back: ours
    assert json.loads(posts[0].body) == json.loads(posts[1].body)


@pytest.mark.parametrize("mode", MODES)
async def test_lost_create_of_a_leaderworkerset_is_not_repeated(api: K8sDouble, mode: str) -> None:
    waits = Waits()
    backend = backend_with(api, waits, cls=PathwaysBackend)
    api.fail("POST", LWS_PATH, 502, apply=True)
    await run(mode, backend, "submit", make_spec("tpu-v6e-2x4"))
    assert len(sent(api, "POST", LWS_PATH)) == 2
    assert len(sent(api, "GET", f"{LWS_PATH}/{LWS}")) == 1
    assert (await backend.astatus(LWS_HANDLE)).status is JobStatus.PENDING


async def test_a_409_on_the_first_create_is_a_conflict(api: K8sDouble) -> None:
    """No earlier attempt could have made it: the name is taken."""
    await add_job(api)
    backend = backend_with(api, Waits())
    with pytest.raises(KubernetesApiError) as info:
        await asyncio.to_thread(backend.submit, make_spec())
    assert info.value.status == 409 and len(sent(api, "POST", JOBS)) == 1


async def test_a_409_for_someone_elses_object_after_a_5xx_is_a_conflict(api: K8sDouble) -> None:
    """A 5xx that did not create the Job, then a foreign Job of that name: not adopted."""
    foreign = to_json(job_manifest(make_spec()))
    foreign["metadata"]["labels"] = {"app": "someone-else"}
    await api.create(JOBS, foreign)
    backend = backend_with(api, Waits())
    api.fail("POST", JOBS, 500)
    with pytest.raises(KubernetesApiError) as info:
        await asyncio.to_thread(backend.submit, make_spec())
    assert info.value.status == 409
    # The retry read it back (not adopted); the submit read it again to name the conflict.
    assert len(sent(api, "POST", JOBS)) == 2 and len(sent(api, "GET", JOB_PATH)) == 2


async def test_a_429_then_409_is_a_conflict(api: K8sDouble) -> None:
    """A throttled create never happened: a 409 after it is someone else's object."""
    await add_job(api)
    backend = backend_with(api, Waits())
    api.fail("POST", JOBS, 429)
    with pytest.raises(KubernetesApiError) as info:
        await backend._arun(backend._submit_plan(make_spec()))
    # No read-back by the retry (nothing can have been created); one by the submit, which
    # names the conflict (and would adopt only an object its owner token proves ours).
    assert info.value.status == 409 and len(sent(api, "GET", JOB_PATH)) == 1


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1, got 0"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="wait_max_s must not be negative"):
        RetryPolicy(wait_max_s=-1)


# ---- the policy comes from Airflow's configuration ------------------------------------------


@pytest.fixture
def gke_config(api: K8sDouble, monkeypatch: pytest.MonkeyPatch) -> KineticConfig:
    """A GKE target whose client factory the hook builds (providers-google, fake token)."""
    monkeypatch.setattr("google.auth.default", lambda scopes=None, **_: (FakeCredentials(), "p"))
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    endpoint = {"host": str(api.url).rstrip("/"), "ca_data": None}
    return KineticConfig(
        backend="gke", bucket="kn-jobs", project="proj", zone="z", cluster="c1", endpoint=endpoint
    )


async def test_the_hook_takes_the_policy_from_airflow_config(
    api: K8sDouble, gke_config: KineticConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__KINETIC__K8S_API_ATTEMPTS", "2")
    monkeypatch.setenv("AIRFLOW__KINETIC__K8S_API_RETRY_WAIT_MIN", "0")
    monkeypatch.setenv("AIRFLOW__KINETIC__K8S_API_RETRY_WAIT_MAX", "0")
    backend = hook_backend_for(gke_config)
    assert backend.retry_policy == RetryPolicy(attempts=2, wait_initial_s=0, wait_max_s=0)
    await add_job(api)
    api.fail("GET", JOB_PATH, 503, times=10)
    with pytest.raises(KubernetesApiError, match="HTTP 503 .*gave up after 2 attempts"):
        await backend.astatus(HANDLE)
    assert len(sent(api, "GET", JOB_PATH)) == 2


async def test_defaults_and_a_bad_option(
    gke_config: KineticConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hook_backend_for(gke_config).retry_policy == RetryPolicy()
    monkeypatch.setenv("AIRFLOW__KINETIC__K8S_API_ATTEMPTS", "0")
    with pytest.raises(KineticConfigError, match="attempts must be at least 1, got 0"):
        hook_backend_for(gke_config)
