"""Capacity kinds: parsing, the errors bad values get, and the fields each kind sets.

Manifests are validated against the Kubernetes schema (Jobs, pod templates) and the
LeaderWorkerSet CRD, as in ``test_manifests``; the keys themselves are pinned here
against ``core/catalog/capacity_gke.py``, whose comments cite the GKE and Kueue pages.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import kubernetes_validate
import pytest

from airflow_provider_kinetic.core.backends.k8s.manifests import job_manifest, lws_manifest
from airflow_provider_kinetic.core.catalog.accelerators import parse_accelerator
from airflow_provider_kinetic.core.catalog.capacity import (
    Capacity,
    InvalidCapacityError,
    check_chain,
    parse_chain,
    seconds,
    supported_kinds,
)
from airflow_provider_kinetic.core.spec.pod import JobSpec
from tests.unit.core.backends.k8s.test_manifests import (  # noqa: F401 - fixtures
    K8S_VERSION,
    _cached_k8s_schemas,
    lws_validator,
    make_spec,
)


def spec_for(accelerator: str, capacity: str | None, **extra: Any) -> JobSpec:
    step = parse_chain(capacity)[0] if capacity else None
    return make_spec(accelerator, capacity=step, **extra)


# ---- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on-demand", Capacity("on-demand")),
        (" Spot ", Capacity("spot")),
        ("flex-start", Capacity("flex-start")),
        ("reservation:r1", Capacity("reservation", "r1")),
        ("reservation:shared-proj/r-2", Capacity("reservation", "r-2", "shared-proj")),
        ("queue:team-a", Capacity("queue", "team-a")),
        ("class:tpu-first", Capacity("class", "tpu-first")),
    ],
)
def test_each_kind_parses_and_prints_back(text: str, expected: Capacity) -> None:
    (step,) = parse_chain(text)
    assert step == expected
    assert parse_chain(str(step)) == (step,)


def test_a_chain_keeps_its_order_and_default_is_on_demand() -> None:
    chain = parse_chain(["reservation:r1", "spot", "flex-start"])
    assert [str(s) for s in chain] == ["reservation:r1", "spot", "flex-start"]
    assert parse_chain(None) == (Capacity("on-demand"),)
    assert parse_chain(None, spot=True) == parse_chain("spot", spot=True) == (Capacity("spot"),)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("ondemand", "unknown capacity kind 'ondemand'"),
        ("reservation:", "'reservation' needs a name"),
        ("reservation: ", "'reservation' needs a name"),
        ("queue:Team_A", "'team_a' is not a valid queue name"),
        ("class:a/b", "only a reservation may name a project"),
        ("reservation:p/r1", "'p' is not a Google Cloud project id"),
        (["spot", "reservation:r1", "spot"], "the step 'spot' appears twice"),
        ([], "non-empty list"),
        (7, "expected one capacity or a non-empty list"),
        ([7], "expected a string, got int"),
    ],
)
def test_bad_values_name_the_value_and_the_allowed_forms(value: Any, says: str) -> None:
    with pytest.raises(InvalidCapacityError) as err:
        parse_chain(value)
    assert says in str(err.value)
    assert '"reservation:PROJECT/NAME"' in str(err.value)


def test_spot_flag_conflicts_with_other_kinds() -> None:
    with pytest.raises(InvalidCapacityError, match='put "spot" in the capacity list'):
        parse_chain(["reservation:r1"], spot=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(900, 900.0), ("15m", 900.0), ("2h", 7200.0), ("90s", 90.0), (timedelta(minutes=1), 60.0)],
)
def test_durations(value: Any, expected: float) -> None:
    assert seconds(value, "capacity_wait") == expected


@pytest.mark.parametrize("value", [0, -5, "0m", "soon", None, True])
def test_a_wait_must_be_a_positive_duration(value: Any) -> None:
    with pytest.raises(InvalidCapacityError, match="capacity_wait"):
        seconds(value, "capacity_wait")


def test_max_run_duration_is_capped_at_seven_days() -> None:
    assert seconds("7d", "max_run_duration", 7 * 86400) == 7 * 86400
    with pytest.raises(InvalidCapacityError, match="over GKE's limit of 604800 s"):
        seconds("8d", "max_run_duration", 7 * 86400)


# ---- what GKE offers per accelerator ------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "why"),
    [
        ("tpu-v4-8", "not v4"),
        ("tpu-v3-8", "not v3"),
        ("tpu-v5p-16", "single-host TPU slices only"),
        ("cpu", "not CPU-only nodes"),
    ],
)
def test_flex_start_where_gke_does_not_offer_it_fails_naming_everything(
    accelerator: str, why: str
) -> None:
    accel = parse_accelerator(accelerator)
    assert "flex-start" not in supported_kinds(accel)
    with pytest.raises(InvalidCapacityError) as err:
        check_chain(parse_chain(["spot", "flex-start"]), accel, accelerator)
    text = str(err.value)
    assert why in text and accelerator in text and "'flex-start'" in text
    assert "capacity kinds for" in text and "spot" in text


@pytest.mark.parametrize("accelerator", ["gpu-l4", "gpu-h100x8", "tpu-v5e-4", "tpu-v6e-4"])
def test_flex_start_is_offered_for_gpus_and_single_host_tpus(accelerator: str) -> None:
    assert "flex-start" in supported_kinds(parse_accelerator(accelerator))


# ---- the fields each kind sets --------------------------------------------------------------


def _pod(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]


def test_on_demand_adds_nothing_and_spot_is_the_accelerators_own() -> None:
    plain = job_manifest(make_spec("gpu-l4"))
    assert job_manifest(spec_for("gpu-l4", "on-demand")) == plain
    spot = job_manifest(make_spec("gpu-l4:spot", capacity=Capacity("spot")))
    assert _pod(spot)["nodeSelector"]["cloud.google.com/gke-spot"] == "true"


def test_flex_start_selector_and_the_vms_run_limit_as_deadline() -> None:
    manifest = job_manifest(spec_for("gpu-h100x8", "flex-start"))
    pod = _pod(manifest)
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "cloud.google.com/gke-flex-start": "true",
    }
    assert pod["activeDeadlineSeconds"] == 7 * 86400
    shorter = _pod(job_manifest(spec_for("gpu-l4", "flex-start", max_run_duration_s=3600)))
    assert shorter["activeDeadlineSeconds"] == 3600
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_reservation_selectors_specific_and_shared() -> None:
    own = _pod(job_manifest(spec_for("tpu-v5e-4", "reservation:r1")))["nodeSelector"]
    assert own["cloud.google.com/reservation-name"] == "r1"
    assert own["cloud.google.com/reservation-affinity"] == "specific"
    assert "cloud.google.com/reservation-project" not in own
    assert own["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
    shared = _pod(job_manifest(spec_for("tpu-v5e-4", "reservation:other-proj/r1")))
    assert shared["nodeSelector"]["cloud.google.com/reservation-project"] == "other-proj"


def test_queue_labels_suspend_and_queued_provisioning_toleration() -> None:
    spec = spec_for("gpu-a100x2", "queue:team-a", priority_class="high", max_run_duration_s=7200)
    manifest = job_manifest(spec)
    labels = manifest["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert manifest["spec"]["suspend"] is True
    assert manifest["metadata"]["annotations"] == {
        "provreq.kueue.x-k8s.io/maxRunDurationSeconds": "7200"
    }
    # Kueue reads the Job, not its pods.
    assert "kueue.x-k8s.io/queue-name" not in manifest["spec"]["template"]["metadata"]["labels"]
    tolerations = _pod(manifest)["tolerations"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in (
        tolerations
    )
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_compute_class_replaces_the_accelerator_selectors_but_keeps_requests() -> None:
    manifest = job_manifest(spec_for("tpu-v6e-8", "class:tpu-first"))
    pod = _pod(manifest)
    assert pod["nodeSelector"] == {"cloud.google.com/compute-class": "tpu-first"}
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "capacity", ["reservation:r1", "queue:team-a", "class:tpu-first", "on-demand", "spot"]
)
def test_leaderworkersets_carry_the_same_fields(
    capacity: str,
    lws_validator: Any,  # noqa: F811 - the fixture
) -> None:
    accelerator = "tpu-v6e-4x4:spot" if capacity == "spot" else "tpu-v6e-4x4"
    manifest = lws_manifest(spec_for(accelerator, capacity, priority_class="low"))
    lws_validator.validate(manifest)
    template = manifest["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    kubernetes_validate.validate(
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": template,
        },
        K8S_VERSION,
        strict=True,
    )
    selector = template["spec"]["nodeSelector"]
    labels = manifest["metadata"]["labels"]
    if capacity == "queue:team-a":
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/priority-class"] == "low"
    else:
        assert "kueue.x-k8s.io/queue-name" not in labels
    if capacity == "reservation:r1":
        assert selector["cloud.google.com/reservation-name"] == "r1"
    if capacity == "class:tpu-first":
        assert selector == {"cloud.google.com/compute-class": "tpu-first"}
    if capacity == "spot":
        assert selector["cloud.google.com/gke-spot"] == "true"


# ---- when a step is given up (backends.k8s_capacity) -----------------------------------


def _ago(seconds_: float) -> str:
    from datetime import UTC, datetime

    return (datetime.now(UTC) - timedelta(seconds=seconds_)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job(age_s: float, **spec: Any) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "team-a"} if spec.get("suspend") else {}
    return {
        "metadata": {"name": "kinetic-job-1", "creationTimestamp": _ago(age_s), "labels": labels},
        "spec": spec,
        "status": {},
    }


def _unschedulable_pod(**status: Any) -> dict[str, Any]:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}  # fmt: skip
    return {
        "metadata": {"name": "kinetic-job-1-abc", "creationTimestamp": _ago(60)},
        "status": {"phase": "Pending", "conditions": [cond], **status},
    }


def _read(job: dict[str, Any], pods: list, wait_s: float | None, events=(), timeout=1800.0):
    from datetime import UTC, datetime

    from airflow_provider_kinetic.core.backends.k8s import capacity as k8s_capacity
    from airflow_provider_kinetic.core.backends.k8s import status as k8s_status

    limits = k8s_status.Limits(schedule_timeout_s=timeout)
    now = datetime.now(UTC)
    report = k8s_status.job_status(job, pods, now=now, limits=limits)
    return k8s_capacity.capacity_verdict(report, job, pods, now, wait_s, limits, list(events))


def test_an_unschedulable_step_ends_after_its_wait_and_not_before() -> None:
    from airflow_provider_kinetic.core.spec.handles import REASON_NO_CAPACITY

    early = _read(_job(30), [_unschedulable_pod()], wait_s=60)
    assert (early.status.value, early.reason) == ("PENDING", "Unschedulable")
    late = _read(_job(90), [_unschedulable_pod()], wait_s=60)
    assert (late.status.value, late.reason) == ("FAILED", REASON_NO_CAPACITY)
    assert "Insufficient nvidia.com/gpu" in late.message and "capacity wait 60 s" in late.message
    # The last step (no wait) keeps today's rule: schedule_timeout_s.
    last = _read(_job(90), [_unschedulable_pod()], wait_s=None)
    assert last.status.value == "PENDING"


def test_past_schedule_timeout_a_step_with_a_next_one_moves_on_instead_of_failing() -> None:
    report = _read(_job(120), [_unschedulable_pod()], wait_s=3600, timeout=30)
    assert report.reason == "NoCapacity"
    assert _read(_job(120), [_unschedulable_pod()], wait_s=None, timeout=30).reason == (
        "Unschedulable"
    )


def test_a_step_whose_container_ever_started_is_never_given_up() -> None:
    restarted = _unschedulable_pod(
        containerStatuses=[{"name": "kinetic-worker", "restartCount": 1, "state": {}}]
    )
    assert _read(_job(900), [restarted], wait_s=60).status.value == "PENDING"


def test_a_triggered_scale_up_is_waited_for_until_schedule_timeout() -> None:
    events = [
        {"reason": "NotTriggerScaleUp", "lastTimestamp": _ago(50)},
        {"reason": "TriggeredScaleUp", "lastTimestamp": _ago(10)},
    ]
    waiting = _read(_job(90), [_unschedulable_pod()], wait_s=60, events=events)
    assert waiting.status.value == "PENDING" and "adding a node" in waiting.message
    gone = _read(_job(90), [_unschedulable_pod()], wait_s=60, events=events[:1])
    assert gone.reason == "NoCapacity"


def test_a_queued_job_waits_for_admission_then_moves_on_after_its_wait() -> None:
    queued = _read(_job(10, suspend=True), [], wait_s=60)
    assert (queued.status.value, queued.reason) == ("PENDING", "NotAdmitted")
    assert queued.message == "waiting for admission in queue team-a"
    assert _read(_job(90, suspend=True), [], wait_s=60).reason == "NoCapacity"
