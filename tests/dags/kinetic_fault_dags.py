"""DAGs for tests/integration/faults/test_faults_*.py: faults that must neither lose a job's
work nor run it twice (a store that goes away under a deferred task, a signing key
rotated mid-job, a full disk, a submit rejected before its job exists).

Every task uses the ``kinetic_faults`` connection, which each test points at a store
of its own, and takes its marker and release files from the run's conf: functions
count their executions in the marker and hold until the test releases them.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")
CONN = "kinetic_faults"
MARKER = "{{ dag_run.conf['marker'] }}"
RELEASE = "{{ dag_run.conf['release'] }}"


def held(marker: str, release: str, token: str) -> dict:
    """Counts its execution, holds until ``release`` exists, returns ``token``."""
    import os
    import time

    with open(marker, "a") as f:
        f.write("ran\n")
    while not os.path.exists(release):
        time.sleep(0.05)
    return {"answer": 42, "token": token}


def big(marker: str, size: str) -> bytes:
    """A result of ``size`` bytes (a full disk meets it when it is written)."""
    with open(marker, "a") as f:
        f.write("ran\n")
    return b"r" * int(size)


def needs_a_package() -> str:
    """Imports the package its requirements name: it exists once the test 'fixes' it."""
    import kinetic_fault_pkg

    return kinetic_fault_pkg.VALUE


with DAG("kinetic_fault_outage", schedule=None, start_date=START, catchup=False) as outage:
    KineticRunOperator(
        task_id="held",
        python_callable=held,
        op_args=[MARKER, RELEASE, "{{ dag_run.conf['token'] }}"],
        kinetic_conn_id=CONN,
        deferrable=True,
        poll_interval=0.5,
    )

with DAG("kinetic_fault_rotation", schedule=None, start_date=START, catchup=False) as rotation:
    KineticRunOperator(
        task_id="held",
        python_callable=held,
        op_args=[MARKER, RELEASE, "{{ dag_run.conf['token'] }}"],
        kinetic_conn_id=CONN,
        poll_interval=0.2,
    )

with DAG("kinetic_fault_disk_full", schedule=None, start_date=START, catchup=False) as disk_full:
    KineticRunOperator(
        task_id="big",
        python_callable=big,
        op_args=[MARKER, "{{ dag_run.conf['size'] }}"],
        kinetic_conn_id=CONN,
        poll_interval=0.2,
    )

with DAG("kinetic_fault_rejected", schedule=None, start_date=START, catchup=False) as rejected:
    KineticRunOperator(
        task_id="needs_pkg",
        python_callable=needs_a_package,
        requirements=["kinetic-fault-pkg==1.0"],
        kinetic_conn_id=CONN,
        poll_interval=0.2,
    )
