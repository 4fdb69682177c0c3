"""Every path a job can end on, once per cleanup policy
(tests/integration/core/jobs/test_history.py).

One DAG (``kinetic_history``), run once by the test module, with one task group per
cleanup policy and one more (``cleanup``, policy ``never``) that the ``jobs cleanup``
test deletes from.  Each group runs a sync job, a deferred job, a job submitted now and
waited for by a sensor, a batch with one failing child (returned as an error value), a
failing job and a job whose result travels by reference, through its own connection
(``kinetic_history_{group}``, set by the test) and so its own store: what one policy
leaves never meets another's.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, TaskGroup

from airflow_provider_kinetic import KineticJobSensor, KineticMapOperator, KineticRunOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
DAG_ID = "kinetic_history"
#: task group (and connection suffix) -> the cleanup policy of its tasks
GROUPS = {"on_success": "on_success", "always": "always", "never": "never", "cleanup": "never"}


def say(tag: str) -> str:
    print(f"history-test {tag}", flush=True)
    return tag


def child(i: int) -> int:
    print(f"history-test child {i}", flush=True)
    if i == 1:
        raise ValueError("child 1 fails on purpose")
    return i * 10


def big() -> str:
    print("history-test big", flush=True)
    return "x" * 5000  # over the test's max_xcom_result_bytes: XCom holds a reference


def broken() -> None:
    print("history-test broken", flush=True)
    raise RuntimeError("broken on purpose")


with DAG(DAG_ID, schedule=None, start_date=START, catchup=False) as history_dag:
    for _group, _policy in GROUPS.items():
        with TaskGroup(_group):
            common = {"kinetic_conn_id": f"kinetic_history_{_group}", "cleanup": _policy}
            KineticRunOperator(
                task_id="sync", python_callable=say, op_args=["sync"], poll_interval=0.1,
                **common,
            )  # fmt: skip
            KineticRunOperator(
                task_id="deferred", python_callable=say, op_args=["deferred"],
                deferrable=True, poll_interval=0.1, **common,
            )  # fmt: skip
            submit = KineticRunOperator(
                task_id="submit", python_callable=say, op_args=["sensor"],
                wait_for_completion=False, **common,
            )  # fmt: skip
            wait = KineticJobSensor(
                task_id="wait", handle=f"{{{{ ti.xcom_pull(task_ids='{_group}.submit') }}}}",
                return_result=True, poke_interval=0.1, **common,
            )  # fmt: skip
            submit >> wait
            KineticMapOperator(
                task_id="batch", python_callable=child, inputs=[0, 1, 2],
                return_exceptions=True, poll_interval=0.1, **common,
            )  # fmt: skip
            KineticRunOperator(task_id="big", python_callable=big, poll_interval=0.1, **common)
            KineticRunOperator(
                task_id="failing", python_callable=broken, poll_interval=0.1, retries=0,
                **common,
            )  # fmt: skip
