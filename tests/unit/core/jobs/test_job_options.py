"""JobOptions: one checked record of a job's options, from the operator to the pod.

It refuses a bad value naming it and the allowed forms; the template carries it (flat in
its wire form); the work digest covers its fields by their metadata, with the values
digests had before the record existed (an unchanged retry across the upgrade adopts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.catalog.accelerators import InvalidAcceleratorError
from airflow_provider_kinetic.core.catalog.capacity import InvalidCapacityError
from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.jobs.options import (
    NOT_WORK,
    JobOptions,
    default_of,
    option,
    option_names,
)
from airflow_provider_kinetic.core.jobs.template import JobTemplate
from airflow_provider_kinetic.core.jobs.work import template_options, work_digest

CALL = "c" * 64


def template(options: JobOptions) -> JobTemplate:
    return JobTemplate(
        backend="gke", func_name="f", payload_uri="gs://b/p", payload_sha256="0",
        context_uri="gs://b/c", context_sha256="1", output_dir="gs://b/out", env={"A": "1"},
        fuse=[FuseMount("gs://b/p/", "/mnt/p", True)], image="img:1",
        requirements=["numpy==2.0"], options=options.resolved(),
    )  # fmt: skip


def digest(options: JobOptions) -> str:
    return work_digest(call=CALL, options=template_options(template(options), ["X_*"]))


# Computed with the digest as it was before JobOptions (template_options of commit
# 589bc74) for the same template: a retry planned by this version adopts a job an
# earlier one started.
DIGESTS_BEFORE = {
    "defaults": "9748e2e38a349d9cb3fb16654791dc06a4e45f293715ade13f88ead5d518da93",
    "set": "398ebef04f4104f776de962186af652bcd34c0e375d727818ce467c0bd66f5e3",
}


def test_the_digest_of_unchanged_options_is_the_one_earlier_versions_made():
    assert digest(JobOptions()) == DIGESTS_BEFORE["defaults"]
    work = JobOptions(
        accelerator="tpu-v5e-4", spot=True, cpu="2", memory="8Gi", labels={"team": "ml", "a": 1}
    )
    assert digest(work) == DIGESTS_BEFORE["set"]
    # Where and how it runs is not what it computes: the same work, the same digest.
    elsewhere = work.but(
        capacity="spot", capacity_wait_s="2h", checkpoint_sync_s=5, checkpoint_restore="any"
    )
    assert digest(elsewhere) == DIGESTS_BEFORE["set"]
    assert digest(work.but(cpu="3")) != DIGESTS_BEFORE["set"]
    assert digest(JobOptions(accelerator="tpu-v5e-4:spot")) == digest(
        JobOptions(accelerator="tpu-v5e-4", spot=True)
    )


def test_num_slices_is_in_the_digest_only_when_more_than_one():
    one = JobOptions(accelerator="tpu-v5p-2x2x4")
    assert one.num_slices == 1 and "num_slices" not in one.work_options()
    four = one.but(num_slices=4)
    assert four.work_options()["num_slices"] == 4 and digest(four) != digest(one)
    assert four.pod_inputs()["num_slices"] == 4
    assert JobOptions(accelerator="tpu-v6e-4x4", num_slices=2).num_slices == 2


def test_a_new_option_is_in_the_digest_when_set_and_only_then():
    @dataclass(frozen=True)
    class Later(JobOptions):
        knob: int = option(0)  # a new option: no metadata, no edit elsewhere
        where: str = option("here", work=NOT_WORK)

    assert Later().work_options() == JobOptions().work_options()  # old digests stay
    assert Later(knob=3).work_options() == {**JobOptions().work_options(), "knob": 3}
    assert Later(where="there").work_options() == JobOptions().work_options()


def test_the_template_wire_form_is_flat_and_round_trips():
    options = JobOptions(
        accelerator="gpu-l4", cpu="2", labels={"team": "ml"}, capacity=["reservation:r1", "spot"],
        capacity_wait_s=60, priority_class="high", checkpoint_sync_s=2, checkpoint_restore="any",
    )  # fmt: skip
    wire = json.loads(json.dumps(template(options).to_dict()))
    assert "options" not in wire and {"backend", "image", "fuse"} <= set(wire)
    assert {k: wire[k] for k in option_names()} == options.to_dict()
    assert wire["capacity"] == ["reservation:r1", "spot"] and wire["accelerator"] == "gpu-l4"
    assert JobTemplate.from_dict(wire) == template(options)
    # A template written before JobOptions (no spot, no checkpoint_restore) still reads.
    del wire["spot"], wire["checkpoint_restore"]
    back = JobTemplate.from_dict(wire).options
    assert back.checkpoint_sync_s == 2.0 and back.checkpoint_restore == "same_work"


def test_the_template_and_its_options_never_share_a_wire_key():
    own = {f.name for f in fields(JobTemplate)} - {"options"}
    assert own & option_names() == set()


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        ({"accelerator": "quantum"}, InvalidAcceleratorError, "'quantum'.*Allowed forms"),
        ({"accelerator": 4}, TypeError, "accelerator must be a string such as 'cpu'.*got int"),
        ({"spot": "yes"}, TypeError, "spot must be True or False, got 'yes'"),
        ({"cpu": "lots"}, ValueError, "cpu must be a Kubernetes quantity such as '500m'.*'lots'"),
        ({"memory": [1]}, ValueError, r"memory must be a Kubernetes quantity.*\[1\]"),
        ({"labels": ["a"]}, TypeError, r"labels must be a dict of name -> value, got \['a'\]"),
        ({"labels": {"a": [1]}}, ValueError, "label 'a' must have a string or number value"),
        ({"capacity": "bogus"}, InvalidCapacityError, "'bogus'.*Allowed: \"on-demand\""),
        ({"capacity_wait_s": "soon"}, InvalidCapacityError, "'soon'.*\"15m\""),
        ({"priority_class": " "}, ValueError, "priority_class must be the name of a Kueue"),
        ({"max_run_duration_s": "30d"}, InvalidCapacityError, "max_run_duration_s"),
        ({"checkpoint_sync_s": 0}, ValueError, "checkpoint_sync_s must be a positive number"),
        ({"checkpoint_restore": "x"}, ValueError, "'same_work' or 'any', got 'x'"),
        ({"num_slices": 0}, ValueError, "num_slices must be a whole number >= 1, got 0"),
        ({"max_restarts": -1}, ValueError, "max_restarts must be a whole number >= 0, got -1"),
        ({"num_slices": "2"}, ValueError, "num_slices must be a whole number >= 1, got '2'"),
        ({"num_slices": 2}, ValueError, r"'cpu' is not one\. Allowed: multi-host TPU slices of v4"),
        (
            {"num_slices": 2, "accelerator": "gpu-h100x8"},
            ValueError,
            "num_slices=2 needs an accelerator GKE can join.*'gpu-h100x8'.*v5p, v6e",
        ),
        ({"num_slices": 2, "accelerator": "tpu-v3-4x4"}, ValueError, "'tpu-v3-4x4' is not one"),
        ({"num_slices": 3, "accelerator": "tpu-v5e-2x2"}, ValueError, "is a single-host slice"),
    ],
)
def test_a_bad_option_is_refused_naming_it_and_the_allowed_forms(changes, error, says):
    with pytest.raises(error, match=says):
        JobOptions(**changes)
    with pytest.raises(error, match=says):  # a copy is checked as it is made, too
        JobOptions().but(**changes)


def test_options_are_kept_in_one_form():
    assert JobOptions(accelerator="tpu-v5e-4:spot") == JobOptions(
        accelerator="tpu-v5e-4", spot=True
    )
    assert JobOptions(accelerator="tpu-v5e-4:spot").spot is True
    assert JobOptions(capacity=" Spot ").capacity == ["spot"]
    assert JobOptions(capacity_wait_s="2h").capacity_wait_s == 7200.0
    assert JobOptions(checkpoint_sync_s="2.5").checkpoint_sync_s == 2.5
    assert JobOptions().with_default_capacity(["reservation:r1"]).capacity == ["reservation:r1"]
    assert JobOptions(capacity="spot").with_default_capacity(["reservation:r1"]).capacity == [
        "spot"
    ]


def test_every_option_an_operator_takes_reaches_the_request():
    """build_request hands every operator option to JobOptions (labels: plain Python)."""
    op = KineticRunOperator(
        task_id="t", python_callable=len, accelerator="tpu-v5e-4", cpu="2", memory="1Gi",
        capacity=["reservation:r1", "spot"], capacity_wait="1h", priority_class="high",
        max_run_duration="1d", checkpoint_sync_s=5, checkpoint_restore="any",
        debug=True, debug_port=5679, debug_wait=60,
    )  # fmt: skip
    identity = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}
    options = op.build_request(identity, lambda key: f"gs://b/{key}").options
    unset = {f.name for f in fields(options) if getattr(options, f.name) == default_of(f)}
    # spot: the chain has it; labels: no operator option; num_slices and max_restarts (a
    # multi-slice job's): need a multi-host TPU (the test below).
    assert unset == {"spot", "labels", "num_slices", "max_restarts"}
    spot = KineticRunOperator(task_id="s", python_callable=len, accelerator="tpu-v5e-4", spot=True)
    assert spot.build_request(identity, lambda key: f"gs://b/{key}").options.spot is True


def test_num_slices_reaches_the_request_and_is_refused_at_parse_time():
    identity = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}
    op = KineticRunOperator(
        task_id="t", python_callable=len, accelerator="tpu-v5p-2x2x4", num_slices=4
    )
    options = op.build_request(identity, lambda key: f"gs://b/{key}").options
    # The JobSet restarts the gang for the task's preemption (default 2) and infra re-submits.
    assert (options.num_slices, options.max_restarts) == (4, 2)
    assert (
        options.pod_inputs()["max_restarts"] == 2 and "max_restarts" not in options.work_options()
    )
    op.retry_on = {"preemption": 3, "infra": 1, "user_error": 5}
    assert op.build_request(identity, lambda key: f"gs://b/{key}").options.max_restarts == 4
    assert "num_slices" in KineticRunOperator.template_fields
    # Templated: checked once rendered ("4" renders as text).
    templated = KineticRunOperator(
        task_id="u", python_callable=len, accelerator="tpu-v6e-4x4", num_slices="{{ n }}"
    )
    templated.num_slices = "2"
    assert templated.build_request(identity, lambda k: f"gs://b/{k}").options.num_slices == 2
    for accelerator, says in [
        ("gpu-h100x8", "'gpu-h100x8' is not one. Allowed: multi-host TPU slices of v4"),
        ("cpu", "'cpu' is not one"),
        ("tpu-v5e-4", "single-host slice"),
    ]:
        with pytest.raises(ValueError, match=says):
            KineticRunOperator(
                task_id="v", python_callable=len, accelerator=accelerator, num_slices=2
            )


def test_a_map_runs_one_slice():
    from airflow_provider_kinetic import KineticMapOperator

    with pytest.raises(ValueError, match="num_slices=2: KineticMapOperator runs one slice"):
        KineticMapOperator(
            task_id="m", python_callable=len, inputs=[1], accelerator="tpu-v5p-2x2x4", num_slices=2
        )


def trains() -> str:
    return "trained"


def test_task_kinetic_takes_num_slices_too():
    from airflow_provider_kinetic.decorators.kinetic import KineticDecoratedOperator

    op = KineticDecoratedOperator(
        task_id="d", python_callable=trains, accelerator="tpu-v6e-4x4", num_slices="{{ n }}"
    )
    assert "num_slices" in KineticDecoratedOperator.template_fields
    op.num_slices = "3"  # as rendered
    identity = {"dag_id": "d", "task_id": "d", "run_id": "r", "map_index": -1, "try_number": 1}
    assert op.build_request(identity, lambda key: f"gs://b/{key}").options.num_slices == 3
    with pytest.raises(ValueError, match="single-host slice"):
        KineticDecoratedOperator(
            task_id="e", python_callable=trains, accelerator="tpu-v6e-4", num_slices=2
        )
