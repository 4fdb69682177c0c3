"""Every operator option reaches both a KineticRunOperator job and a KineticMapOperator
child: the request -> template -> spec path is written once for both.

Each case sets one option on both operators, plans them through their own code
(``build_request`` -> ``plan_job`` for a single job, ``BatchTry.plan`` -> ``child_spec``
for a batch child) against a GKE connection (no credentials, nothing uploaded), and
checks the option in the child's spec or payload.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import PAYLOAD_CACHE
from airflow_provider_kinetic.core.jobs.submit import plan_job
from airflow_provider_kinetic.core.spec.pod import JobSpec
from airflow_provider_kinetic.deployment.signing import deployment_secret
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.operators.batch_try import BatchTry
from tests.fixtures.local_conn import set_conn

#: Handles planned so far (the newest last): what a job carries beside its spec.
_HANDLES: list[Any] = []
IDENTITY = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}
CHILD = 2


def work(x: int = 0, **kwargs: Any) -> int:
    return x


@pytest.fixture
def conn(monkeypatch) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # any upload fails
    extras = {"backend": "auto", "bucket": "bkt", "project": "p", "zone": "z", "cluster": "c",
              "namespace": "ns-opt", "image": "img:1", "service_account": "sa-opt"}  # fmt: skip
    set_conn(monkeypatch, "kn_opt", extras)
    monkeypatch.setenv("KN_OPT_SECRET_FREE", "forwarded")
    return "kn_opt"


def planned(op: Any) -> tuple[JobSpec, dict[str, Any], str]:
    """(spec, unpickled payload, accelerator string in the handle) through the operator."""
    config = KineticHook(op.kinetic_conn_id).get_config()
    store = config.store()
    if isinstance(op, KineticMapOperator):
        planned = BatchTry.dry(op).plan()
        state, objects = planned.state, planned.objects
        spec = batchlaunch.child_spec(
            state, CHILD, "job-0000000c", config, store, deployment_secret()
        )
        handle = state.template.handle(config, store, spec, CHILD)
        blob = next(v for k, v in objects.items() if k.startswith(PAYLOAD_CACHE) and ".pkl" in k)
    else:
        request = op.build_request(IDENTITY, store.uri)
        plan = plan_job(request, config, store, "job-0000000a", deployment_secret())
        spec, handle, blob = plan.spec, plan.handle, plan.packed.payload
    assert handle.job_id == spec.job_id and handle.image_uri == spec.container["image"]
    _HANDLES.append(handle)
    return spec, cloudpickle.loads(blob), handle.accelerator


def both(tmp_path: Path, conn: str, **options: Any) -> list[tuple[JobSpec, dict, str]]:
    run = KineticRunOperator(task_id="run", python_callable=work, kinetic_conn_id=conn, **options)
    mapped = KineticMapOperator(
        task_id="map", python_callable=work, inputs=[1, 2, 3], kinetic_conn_id=conn, **options
    )
    return [planned(run), planned(mapped)]


def _dir(tmp_path: Path) -> str:
    (tmp_path / "vol").mkdir(exist_ok=True)
    (tmp_path / "vol" / "f.txt").write_text("x")
    return str(tmp_path / "vol")


def _resources(spec: JobSpec) -> dict:
    return spec.container.get("resources", {})


#: The context the ``context_excludes`` case expects, found by its ``make`` step.
_CONTEXT: dict[str, str] = {}


def _project_with_dag(tmp_path: Path) -> dict[str, Any]:
    """A DAG file in a project dir with a file the option leaves out of the context."""
    from airflow.sdk import DAG

    from airflow_provider_kinetic.core.runtime.context import build_context

    project = tmp_path / "proj"
    project.mkdir(exist_ok=True)
    (project / "requirements.txt").write_text("")
    (project / "dag.py").write_text("# the DAG\n")
    (project / "keep.txt").write_text("kept")
    (project / "scratch.log").write_text("left out")
    entry = str(project / "dag.py")
    _CONTEXT["with"] = build_context(entry, excludes=["*.log"]).sha256
    _CONTEXT["without"] = build_context(entry).sha256
    dag = DAG("ctx_opt", schedule=None)
    dag.fileloc = entry
    return {"dag": dag, "context_excludes": ["*.log"]}


def _context_sha(spec: JobSpec) -> str:
    return spec.args[spec.args.index("--context-sha256") + 1]


#: option name -> (operator kwargs from tmp_path, check(spec, payload, accelerator, is_child)).
CASES: dict[str, tuple[Callable[[Path], dict], Callable[..., bool]]] = {
    "accelerator": (
        lambda p: {"accelerator": "gpu-l4"},
        lambda s, pl, acc, child: (
            s.pod["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-l4"
            and _resources(s)["limits"] == {"nvidia.com/gpu": "1"}
        ),
    ),
    "spot": (
        lambda p: {"accelerator": "tpu-v5e-4", "spot": True},
        lambda s, pl, acc, child: (
            s.pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true" and acc == "tpu-v5e-4:spot"
        ),
    ),
    "volumes": (
        lambda p: {"volumes": {"/mnt/vol": Data(_dir(p))}},
        lambda s, pl, acc, child: [v["mount_path"] for v in pl["volumes"]] == ["/mnt/vol"],
    ),
    "output_dir": (
        lambda p: {"output_dir": "gs://out/run-1"},
        lambda s, pl, acc, child: (
            s.env["KINETIC_OUTPUT_DIR"] == ("gs://out/run-1/2" if child else "gs://out/run-1")
        ),
    ),
    "capture_env_vars": (
        lambda p: {"capture_env_vars": ["KN_OPT_*"]},
        # A secret of the job (Secret / 0600 file), never plain env or payload.
        lambda s, pl, acc, child: (
            s.secrets["KN_OPT_SECRET_FREE"] == "forwarded"
            and "KN_OPT_SECRET_FREE" not in s.env
            and "KN_OPT_SECRET_FREE" not in pl["env_vars"]
        ),
    ),
    "cpu": (
        lambda p: {"cpu": "3"},
        lambda s, pl, acc, child: _resources(s)["requests"]["cpu"] == "3",
    ),
    "memory": (
        lambda p: {"memory": "5Gi"},
        lambda s, pl, acc, child: _resources(s)["requests"]["memory"] == "5Gi",
    ),
    "op_kwargs": (
        lambda p: {"op_kwargs": {"shared": 7}},
        lambda s, pl, acc, child: pl["kwargs"] == {"shared": 7},
    ),
    "context_excludes": (
        _project_with_dag,
        lambda s, pl, acc, child: (
            _context_sha(s) == _CONTEXT["with"] != _CONTEXT["without"]
            and s.args[s.args.index("--context-gcs") + 1].endswith(f"/{_CONTEXT['with']}.zip")
        ),
    ),
    "container_image": (
        lambda p: {"container_image": "us-docker.pkg.dev/p/r/runner:2"},
        lambda s, pl, acc, child: s.container["image"] == "us-docker.pkg.dev/p/r/runner:2",
    ),
    "requirements": (
        # Given explicitly with a custom image: uploaded and installed at start.
        lambda p: {"requirements": ["numpy==2.0", "jax==0.4.30"]},
        lambda s, pl, acc, child: (
            dict(zip(s.args[::2], s.args[1::2], strict=True))["--requirements-gcs"].endswith(
                "/job-0000000a/requirements.txt" if not child else ".requirements.txt"
            )
            and s.args[4:6] == ["--result-gcs", s.args[5]]  # kinetic's flag order
        ),
    ),
    "capacity": (
        lambda p: {"accelerator": "tpu-v5e-4", "capacity": ["reservation:r1", "spot"]},
        lambda s, pl, acc, child: (
            s.pod["nodeSelector"]["cloud.google.com/reservation-name"] == "r1"
            and "cloud.google.com/gke-spot" not in s.pod["nodeSelector"]
            and acc == "tpu-v5e-4"
        ),
    ),
    "capacity_wait": (
        lambda p: {"capacity": ["reservation:r1", "spot"], "capacity_wait": "2h"},
        lambda s, pl, acc, child: _HANDLES[-1].capacity_wait_s == 7200.0,
    ),
    "priority_class": (
        lambda p: {"capacity": "queue:team-a", "priority_class": "urgent"},
        lambda s, pl, acc, child: (
            s.capacity.owner_labels
            == {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "urgent"}
            and s.capacity.suspend
        ),
    ),
    "max_run_duration": (
        lambda p: {"accelerator": "gpu-l4", "capacity": "flex-start", "max_run_duration": "1d"},
        lambda s, pl, acc, child: (
            s.pod["activeDeadlineSeconds"] == 86400
            and s.pod["nodeSelector"]["cloud.google.com/gke-flex-start"] == "true"
        ),
    ),
    "checkpoint_sync_s": (
        lambda p: {"checkpoint_sync_s": 2},
        lambda s, pl, acc, child: (
            s.env["KINETIC_CHECKPOINT_SYNC_S"] == "2.0"
            and s.env["KINETIC_CHECKPOINT_URI"].endswith(f"/inputs/{CHILD}/" if child else "/job/")
        ),
    ),
    "checkpoint_restore": (
        # "any": the task run's one slot, whatever work wrote it (the default keys the
        # slot on the work digest: .../work/{digest}/).
        lambda p: {"checkpoint_restore": "any"},
        lambda s, pl, acc, child: (
            "/work/" not in s.env["KINETIC_CHECKPOINT_URI"]
            and s.env["KINETIC_CHECKPOINT_URI"].endswith(f"/inputs/{CHILD}/" if child else "/job/")
        ),
    ),
    "kinetic_conn_id": (
        lambda p: {},
        lambda s, pl, acc, child: (
            (s.namespace, s.container["image"], s.pod["serviceAccountName"])
            == ("ns-opt", "img:1", "sa-opt")
        ),
    ),
}


def test_cases_cover_every_shared_option():
    """A new option on KineticOperatorBase must get a case here."""
    import inspect

    from airflow_provider_kinetic.operators.common import KineticOperatorBase

    params = set(inspect.signature(KineticOperatorBase.__init__).parameters) - {"self", "kwargs"}
    waiting_only = {"deferrable", "poll_interval", "cleanup"}  # how it waits, what stays after
    assert params - waiting_only - set(CASES) == set()


@pytest.mark.parametrize("option", list(CASES))
def test_option_reaches_single_job_and_batch_child(option, tmp_path, conn):
    make, check = CASES[option]
    (run_spec, run_payload, run_acc), (child_spec, child_payload, child_acc) = both(
        tmp_path, conn, **make(tmp_path)
    )
    assert check(run_spec, run_payload, run_acc, False), run_spec
    assert check(child_spec, child_payload, child_acc, True), child_spec
    assert child_spec.env["KINETIC_GROUP_INDEX"] == str(CHILD)
    assert child_spec.labels["kinetic-group-index"] == str(CHILD)


@pytest.mark.parametrize("option", ["spot", "cpu", "output_dir", "requirements"])
def test_without_the_option_the_check_fails(option, tmp_path, conn):
    """The checks can fail: with defaults, none of these holds."""
    _, check = CASES[option]
    for spec, payload, acc in both(tmp_path, conn):
        with pytest.raises((KeyError, AssertionError)):
            assert check(spec, payload, acc, False)


def test_debug_reaches_a_single_jobs_spec_and_handle_and_a_map_refuses_it(tmp_path, conn):
    """Debug mode is KineticRunOperator's only (a map's children would each wait for a
    debugger): its port, wait, TTL and label reach the job's spec and handle."""
    run = KineticRunOperator(task_id="run", python_callable=work, kinetic_conn_id=conn,
                             debug=True, debug_port=5681, debug_wait=45)  # fmt: skip
    spec, _, _ = planned(run)
    assert (spec.env["KINETIC_DEBUG_PORT"], spec.env["KINETIC_DEBUG_WAIT_S"]) == ("5681", "45")
    assert spec.container["ports"] == [
        {"name": "debugpy", "containerPort": 5681, "protocol": "TCP"}
    ]
    assert spec.ttl_seconds == 7200 and spec.labels["kinetic-debug"] == "true"
    assert (_HANDLES[-1].debug, _HANDLES[-1].debug_port) == (True, 5681)
    with pytest.raises(ValueError, match="KineticMapOperator does not take debug"):
        KineticMapOperator(task_id="map", python_callable=work, inputs=[1], debug=True)
