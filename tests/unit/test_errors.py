"""Named errors: one ``KineticError`` root; Airflow-layer errors are AirflowExceptions
that carry what a caller needs (job id, the remote cause, a batch's partial results)."""

from __future__ import annotations

import pytest
from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_kinetic import (
    KineticBatchFailed,
    KineticError,
    KineticJobCancelled,
    KineticJobFailed,
    KineticJobSensor,
    KineticRunOperator,
)
from airflow_provider_kinetic.core.backends.k8s.gke import KubernetesApiError
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes
from airflow_provider_kinetic.core.catalog.accelerators import InvalidAcceleratorError
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.jobs.payload import (
    RemoteFunctionError,
    UnpicklableArgumentError,
    dump_result,
    make_result,
)
from airflow_provider_kinetic.core.jobs.signing import sign
from airflow_provider_kinetic.core.spec.handles import InvalidHandleError, JobStatus, StatusReport
from airflow_provider_kinetic.core.storage import LocalStore, ObjectNotFound, PreconditionFailed
from airflow_provider_kinetic.deployment.signing import result_key, result_key_for_job
from airflow_provider_kinetic.operators import batch_finish
from airflow_provider_kinetic.operators.batch_try import BatchTry
from airflow_provider_kinetic.operators.task_try import TaskTry
from tests.fixtures import records
from tests.fixtures.batch_tries import TI, map_operator
from tests.fixtures.fake_ti import FakeTI


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (InvalidAcceleratorError, ValueError),
        (UnpicklableArgumentError, ValueError),
        (RemoteFunctionError, RuntimeError),
        (KubernetesApiError, RuntimeError),
        (ObjectNotFound, FileNotFoundError),
        (PreconditionFailed, FileExistsError),
        (InvalidHandleError, TypeError),
    ],
)
def test_core_errors_share_one_root_and_keep_their_builtin_base(cls, builtin):
    assert issubclass(cls, KineticError) and issubclass(cls, builtin)


@pytest.mark.parametrize("cls", [KineticJobFailed, KineticJobCancelled, KineticBatchFailed])
def test_airflow_layer_errors_are_airflow_exceptions(cls):
    assert issubclass(cls, AirflowException) and issubclass(cls, KineticError)


class Quiet(LocalBackend):
    def read_logs(self, handle, offset=0):
        return "", offset

    def cancel(self, handle) -> None:
        self.cancelled = handle.job_id


def test_failed_job_raises_kinetic_job_failed_with_the_remote_cause(tmp_path):
    store = LocalStore(str(tmp_path))
    blob, _ = dump_result(
        make_result(success=False, exception=ZeroDivisionError("x/0"), traceback="tb")
    )
    handle = records.handle("job-00000001", str(tmp_path))
    store.write_bytes("job-00000001/result.pkl.sig", sign(result_key(handle), blob).encode())
    store.write_bytes("job-00000001/result.pkl", blob)
    op = KineticRunOperator(task_id="t", python_callable=len)
    backend = Quiet(str(tmp_path))
    config = KineticConfig(backend="local", root=str(tmp_path))
    run = TaskTry(op, {"ti": FakeTI()}, config, store, backend, {}, b"k" * 32, None)
    with pytest.raises(
        KineticJobFailed, match="job-00000001 failed: ZeroDivisionError: x/0"
    ) as info:
        run.finish(handle, StatusReport(JobStatus.FAILED, "exit code 1"), 0)
    assert info.value.job_id == "job-00000001"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "Remote traceback:\ntb" in info.value.__cause__.__notes__
    assert backend.cancelled == "job-00000001"  # a failed job is deleted after collection


@pytest.mark.usefixtures("local_conn")
def test_batch_failure_carries_partial_results():
    op = map_operator(python_callable=len, inputs=[1, 2, 3])
    state = records.batch_state(3, {})
    batch = BatchTry.reopen(op, {"ti": TI()}, state)
    store = batch.store
    state.queue.clear()
    for index, ok in enumerate((True, False, True)):
        job = f"job-0000000{index}"
        state.jobs[index], state.done[index] = job, "SUCCEEDED" if ok else "FAILED"
        exc = None if ok else ValueError("bad input 1")
        blob, _ = dump_result(make_result(success=ok, result=index * 10, exception=exc))
        # Signed as a child's result is: the deployment's keyring decides, not the state.
        signature = sign(result_key_for_job(job, state.template.result_auth), blob)
        store.write_bytes(f"{job}/result.pkl.sig", signature.encode())
        store.write_bytes(f"{job}/result.pkl", blob)
    with pytest.raises(KineticBatchFailed, match="1 of 3 inputs failed") as info:
        batch_finish.deliver(batch)
    err = info.value
    assert err.group_id == state.group_id and list(err.failures) == [1]
    assert err.partial_results[0] == 0 and err.partial_results[2] == 20
    assert isinstance(err.partial_results[1], ValueError)
    op.return_exceptions = True
    values = batch_finish.deliver(batch)
    assert values[1] == batchoutcomes.describe_exception(err.failures[1])


def test_sensor_reads_a_rendered_python_dict_literal():
    handle = records.handle("job-0000aaaa", "/r", output_dir="file:///o", group_index=None)
    rendered = str(handle.to_dict())  # what "{{ ti.xcom_pull(...) }}" renders to
    assert "'debug': False" in rendered
    sensor = KineticJobSensor(task_id="s", handle=rendered)
    assert sensor._handle() == handle
    assert KineticJobSensor(task_id="s2", handle=handle.to_json().decode())._handle() == handle
    with pytest.raises(InvalidHandleError, match="neither JSON nor a Python dict literal"):
        KineticJobSensor(task_id="s3", handle="{'job_id': oops}")._handle()
