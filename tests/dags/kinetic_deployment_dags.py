"""Two DAGs for tests/integration/test_deployment_standalone.py, run by a real
``airflow standalone`` configured as a deployment would be:

* ``kinetic_xcom_offload``: a Kinetic task returns a 3 MB value; with the common.io
  object-storage XCom backend configured, a plain ``@task`` downstream receives the
  value itself and checks it against the value made again;
* ``kinetic_quiet_log``: a deferrable Kinetic task whose job prints numbered lines in
  three parts: the first at once, the second once the test says the trigger follows
  the job (a ``go`` file), the third once the test has restarted the triggerer (a
  ``release`` file).
"""

from __future__ import annotations

import hashlib

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
#: Lines the job prints before it waits for the ``go`` file, before it waits for the
#: ``release`` file, and in all.
BEFORE_GO, BEFORE_RELEASE, LINES = 2, 8, 16


def big_value() -> str:
    """3,000,000 characters: 375,000 numbered lines of 8 bytes."""
    return "".join(f"{i:07d}\n" for i in range(375_000))


def summary(value: str) -> dict[str, object]:
    """What the downstream task returns of the value it received (a small XCom)."""
    return {"chars": len(value), "sha256": hashlib.sha256(value.encode()).hexdigest()}


@task
def check_big(value: object) -> dict[str, object]:
    """Fails the run unless ``value`` is the 3 MB value itself (not a reference)."""
    assert isinstance(value, str), f"a {type(value).__name__}, not the value: {str(value)[:300]}"
    assert value == big_value(), "the value received differs from the value returned"
    return summary(value)


with DAG("kinetic_xcom_offload", schedule=None, start_date=START, catchup=False):
    big = KineticRunOperator(task_id="big", python_callable=big_value, deferrable=False)
    check_big(big.output)


def numbered(
    files: str, lines: int = LINES, go: int = BEFORE_GO, release: int = BEFORE_RELEASE
) -> int:
    """``lines`` numbered lines, a tenth of a second apart; before line ``go`` it waits
    for the file ``{files}/go``, before line ``release`` for ``{files}/release``."""
    import os
    import time

    waits = {go: "go", release: "release"}
    for i in range(lines):
        if i in waits:
            while not os.path.exists(os.path.join(files, waits[i])):
                time.sleep(0.1)
        print(f"quiet-log line {i:02d} of {lines}", flush=True)
        time.sleep(0.1)
    return lines


with DAG("kinetic_quiet_log", schedule=None, start_date=START, catchup=False):
    KineticRunOperator(
        task_id="follow",
        python_callable=numbered,
        op_args=["{{ dag_run.conf['files'] }}"],
        deferrable=True,
        poll_interval=0.5,
    )
