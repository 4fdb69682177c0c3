"""``capacity=`` and friends on the operators and the connection: bad values fail at
parse time (or, templated, once rendered, before anything is uploaded); the
connection's default applies to tasks that name none; ``dry_run()`` shows each step;
a step is given up only while the store shows its runner never started."""

from __future__ import annotations

import pytest
import yaml

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
from airflow_provider_kinetic.core.catalog.capacity import InvalidCapacityError
from airflow_provider_kinetic.core.config import KineticConfigError
from airflow_provider_kinetic.core.jobs.checkpoint import STARTED_NAME
from airflow_provider_kinetic.core.jobs.fallback import next_step
from airflow_provider_kinetic.core.jobs.submit import plan_job
from airflow_provider_kinetic.core.spec.handles import (
    REASON_NO_CAPACITY,
    JobHandle,
    JobStatus,
    StatusReport,
)
from airflow_provider_kinetic.core.storage.local import LocalStore
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from tests.fixtures.local_conn import set_conn

IDENTITY = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}


def work() -> int:
    return 1


@pytest.fixture
def gke(monkeypatch):
    def make(**more):
        extras = {"backend": "gke", "bucket": "bkt", "project": "proj", "zone": "us-east5-a",
                  "cluster": "c1", "image": "img:1", **more}  # fmt: skip
        return set_conn(monkeypatch, "kn_cap", extras)

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # any upload fails
    return make


@pytest.mark.parametrize("operator", [KineticRunOperator, KineticMapOperator])
@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"capacity": "bogus"}, "unknown capacity kind 'bogus'"),
        ({"capacity": "reservation:"}, "'reservation' needs a name"),
        ({"capacity": ["spot", "spot"]}, "the step 'spot' appears twice"),
        ({"capacity_wait": 0}, "capacity_wait must be above zero"),
        ({"capacity_wait": "-5m"}, "capacity_wait is not a duration"),
        ({"accelerator": "tpu-v4-8", "capacity": "flex-start"}, "not v4"),
        ({"accelerator": "gpu-l4:spot", "capacity": "reservation:r1"}, "conflicts"),
        ({"max_run_duration": "9d"}, "over GKE's limit"),
    ],
)
def test_bad_capacity_options_fail_when_the_dag_is_parsed(operator, options, says) -> None:
    extra = {"inputs": [1]} if operator is KineticMapOperator else {}
    with pytest.raises(InvalidCapacityError, match=says):
        operator(task_id="t", python_callable=work, **extra, **options)


def test_a_templated_capacity_is_checked_once_rendered_before_any_upload(gke) -> None:
    op = KineticRunOperator(
        task_id="t", python_callable=work, kinetic_conn_id=gke(), capacity="{{ params.c }}"
    )
    op.capacity = "queue:"  # what the template rendered to
    config = KineticHook(op.kinetic_conn_id).get_config()
    store = config.store()
    with pytest.raises(InvalidCapacityError, match="'queue' needs a name"):
        plan_job(op.build_request(IDENTITY, store.uri), config, store, "job-00000001")


def test_the_connections_capacity_is_the_default(gke) -> None:
    conn = gke(capacity="reservation:r1, spot")
    config = KineticHook(conn).get_config()
    assert config.capacity == ["reservation:r1", "spot"]
    store = config.store()
    default = KineticRunOperator(task_id="t", python_callable=work, kinetic_conn_id=conn)
    plan = plan_job(default.build_request(IDENTITY, store.uri), config, store, "job-00000002")
    assert plan.template.options.capacity == ["reservation:r1", "spot"]
    assert plan.spec.pod["nodeSelector"]["cloud.google.com/reservation-name"] == "r1"
    assert (plan.handle.capacity, plan.handle.capacity_wait_s) == ("reservation:r1", 900.0)
    own = KineticRunOperator(
        task_id="t", python_callable=work, kinetic_conn_id=conn, capacity="spot"
    )
    plan = plan_job(own.build_request(IDENTITY, store.uri), config, store, "job-00000003")
    assert plan.template.options.capacity == ["spot"] and plan.handle.capacity_wait_s is None


def test_a_bad_connection_capacity_names_the_extra(gke) -> None:
    with pytest.raises(KineticConfigError, match="extra 'capacity' of connection 'kn_cap'"):
        KineticHook(gke(capacity="reservation:r1, nope")).get_config()


def test_dry_run_prints_every_step_of_a_chain(gke, capsys) -> None:
    op = KineticRunOperator(
        task_id="t",
        python_callable=work,
        kinetic_conn_id=gke(),
        accelerator="gpu-l4",
        capacity=["reservation:other-proj/r1", "queue:team-a", "flex-start"],
        priority_class="high",
    )
    first = op.dry_run()
    out = capsys.readouterr().out
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs[0] == first and len(docs) == 3
    assert "# capacity: reservation r1 (shared from project other-proj) (capacity step 1 of 3)" in (
        out
    )
    assert (
        first["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/reservation-project"]
        == "other-proj"
    )
    assert docs[1]["spec"]["suspend"] is True
    assert docs[1]["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert (
        docs[2]["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-flex-start"]
        == "true"
    )


def test_a_step_is_given_up_only_while_its_runner_never_started(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    chain = ["reservation:r1", "spot"]
    handle = JobHandle("job-0000aaaa", "gke", str(tmp_path), capacity="reservation:r1")
    no_capacity = StatusReport(JobStatus.FAILED, REASON_NO_CAPACITY, "nothing started")
    assert next_step(chain, handle, no_capacity, store) == 1
    # Any other ending is not the chain's business.
    other = StatusReport(JobStatus.FAILED, "NonZeroExit", "exit 1")
    assert next_step(chain, handle, other, store) is None
    # The last step has nothing after it.
    assert next_step(chain, handle.evolve(capacity="spot"), no_capacity, store) is None
    # The runner wrote its start record: it may have run, so never a second step.
    store.write_bytes(f"job-0000aaaa/{STARTED_NAME}", b"{}")
    assert next_step(chain, handle, no_capacity, store) is None


def test_the_decorator_takes_the_same_options() -> None:
    from airflow.sdk import DAG, task

    with DAG("capacity_decorated", schedule=None):

        @task.kinetic(accelerator="gpu-l4", capacity=["reservation:r1", "spot"], capacity_wait="1m")
        def fit() -> int:
            return 1

        op = fit().operator
    assert (op.capacity, op.capacity_wait) == (["reservation:r1", "spot"], "1m")
    assert {"capacity", "capacity_wait", "max_run_duration", "priority_class"} <= set(
        op.template_fields
    )
    with (
        pytest.raises(InvalidCapacityError, match="unknown capacity kind 'bogus'"),
        DAG("capacity_decorated_bad", schedule=None),
    ):

        @task.kinetic(capacity="bogus")
        def bad() -> int:
            return 1

        bad()
