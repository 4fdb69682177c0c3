"""Debug mode's options: checked at parse time (bad values and maps refused, naming why),
carried operator -> JobOptions -> spec and handle, and a debug job on a cluster left to
its TTL when its outcome is collected."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk import task

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs import cleanup
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.runtime.images import plan_image
from airflow_provider_kinetic.core.spec.handles import JobHandle
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures import records

IDENTITY = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1}


def work(x: int = 0) -> int:
    return x


def _options(op: KineticRunOperator) -> JobOptions:
    return op.build_request(IDENTITY, lambda key: f"gs://b/{key}").options


def test_debug_reaches_the_request_with_its_port_and_wait() -> None:
    op = KineticRunOperator(
        task_id="t", python_callable=work, debug=True, debug_port=5999,
        debug_wait=timedelta(minutes=2),
    )  # fmt: skip
    options = _options(op)
    assert (options.debug_port, options.debug_wait_s) == (5999, 120.0)
    assert options.pod_inputs()["debug_port"] == 5999
    assert "debug_port" not in options.work_options()  # how it runs, not what it computes
    off = _options(KineticRunOperator(task_id="u", python_callable=work))
    assert (off.debug_port, off.debug_wait_s) == (None, 1800.0)


def test_task_kinetic_takes_debug() -> None:
    @task.kinetic(debug=True, debug_wait=5)
    def traced() -> int:
        return 1

    from airflow.sdk import DAG

    with DAG("debug_decorated", schedule=None):
        op = traced().operator
    assert (op.debug_settings.port, op.debug_settings.wait_s) == (5678, 5.0)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"debug": "yes"}, "debug must be True or False, got 'yes'"),
        ({"debug": True, "debug_port": 0}, r"debug_port must be a TCP port number \(1-65535\)"),
        ({"debug": True, "debug_port": "5678"}, "debug_port must be a TCP port number"),
        ({"debug": True, "debug_wait": -1}, "debug_wait must be more than 0 seconds, got -1"),
        ({"debug": True, "debug_wait": "30m"}, "debug_wait must be a number of seconds or a"),
    ],
)
def test_bad_debug_values_fail_at_parse_time_naming_them(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        KineticRunOperator(task_id="t", python_callable=work, **kwargs)


@pytest.mark.parametrize("option", [{"debug": True}, {"debug_port": 5678}, {"debug_wait": 9}])
def test_a_map_refuses_debug_mode_naming_why(option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="KineticMapOperator does not take debug.*many children"):
        KineticMapOperator(task_id="m", python_callable=work, inputs=[1, 2], **option)


@pytest.mark.parametrize(
    ("kwargs", "warned"),
    [
        ({"accelerator": "gpu-l4", "spot": True}, "with spot capacity"),
        ({"accelerator": "gpu-l4", "capacity": ["flex-start", "on-demand"]}, "flex-start"),
        ({"accelerator": "gpu-l4"}, None),
    ],
)
def test_debug_with_spot_or_flex_start_warns(kwargs: dict, warned: str | None, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        KineticRunOperator(task_id="t", python_callable=work, debug=True, **kwargs)
    lines = [r.getMessage() for r in caplog.records if "debug=True" in r.getMessage()]
    if warned is None:
        assert lines == []
    else:
        assert len(lines) == 1 and warned in lines[0], lines


def test_the_handle_says_debug_and_its_port_on_the_wire() -> None:
    handle = records.handle("job-1", debug=True, debug_port=5680)
    wire = handle.to_dict()
    assert (wire["debug"], wire["debug_port"]) == (True, 5680)
    assert JobHandle.from_dict(wire) == handle
    assert "debug_port" not in records.handle("job-2").to_dict()


class _Cluster:
    """What ``cleanup.release`` asks of a cluster backend (it keeps its logs); counts
    releases."""

    name = "gke"
    keeps_logs = True

    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, handle: JobHandle) -> None:
        self.released.append(handle.job_id)

    def read_logs(self, handle: JobHandle, offset: int) -> tuple[str, int]:
        return "", offset


def test_a_debug_job_on_a_cluster_is_left_to_its_ttl(tmp_path) -> None:
    backend = _Cluster()
    store = LocalStore(str(tmp_path))
    debug = records.handle("job-d", backend="gke", debug=True, debug_port=5678)
    plain = records.handle("job-p", backend="gke")
    cleanup.after_job(store, backend, [debug, plain], succeeded=True, cleanup="never")
    assert backend.released == ["job-p"]
    cleanup.release(store, backend, [debug])  # jobs cleanup: released on request
    assert backend.released == ["job-p", "job-d"]


def _plan(config: KineticConfig, setting: str | None, requirements: list[str], local=False):
    return plan_image(container_image=setting, requirements=requirements, entry_file=None,
                      category="gpu", local=local, config=config, debug=True)  # fmt: skip


def test_debug_jobs_get_debugpy_in_their_runtime() -> None:
    gke = KineticConfig(backend="gke", bucket="bkt", project="p", zone="europe-west4-a",
                        cluster="c1", base_image_repo="us-docker.pkg.dev/p/kinetic")  # fmt: skip
    prebuilt = _plan(gke, "prebuilt", ["numpy"])
    assert prebuilt.requirements.lines == ["numpy", "debugpy"]
    assert prebuilt.needs_requirements_upload  # installed at the pod's start
    bundled = _plan(gke, "bundled", ["numpy"])
    assert bundled.requirements.lines == ["numpy", "debugpy"]
    plain = plan_image(container_image="bundled", requirements=["numpy"], entry_file=None,
                       category="gpu", local=False, config=gke)  # fmt: skip
    assert bundled.tag != plain.tag  # a debug image of its own
    assert _plan(gke, "bundled", ["debugpy==1.8.22"]).requirements.lines == ["debugpy==1.8.22"]
    assert _plan(gke, "us-docker.pkg.dev/p/r/mine:1", []).requirements.lines == []  # as it is
    local = KineticConfig(backend="local", root="/tmp")
    assert _plan(local, None, ["six"], local=True).requirements.lines == ["six", "debugpy"]
    assert _plan(local, None, [], local=True).requirements.lines == []  # this Python's
