"""DAGs for tests/integration/operators/test_retry_policy.py: Airflow 3.3's ``retry_policy``
(AIP-105) acting on the typed exceptions a failed Kinetic job raises: a user error
fails the task at once (a bug is not re-run at full price), an infra error is retried
by Airflow.  On Airflow 3.1 (no ``retry_policy``) ``retry_on`` alone re-submits the
infra failure within the try."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticInfraError, KineticRunOperator, KineticUserError

try:  # Airflow 3.3+
    from airflow.sdk import ExceptionRetryPolicy, RetryAction, RetryRule
except ImportError:  # Airflow 3.1: retry_on alone
    ExceptionRetryPolicy = None

START = pendulum.datetime(2026, 11, 1, tz="UTC")
CONN = "kinetic_retry_policy"
MARKER = "{{ dag_run.conf['marker'] }}"


def a_bug(marker: str) -> None:
    """Counts its run, then raises: the user's error."""
    with open(marker + ".bug", "a") as f:
        f.write("ran\n")
    raise ValueError("a bug in the function")


def killed_once(marker: str) -> str:
    """Killed by a signal the first time (as a lost node would end it), fine after."""
    import os
    import signal
    from pathlib import Path

    path = Path(marker + ".node")
    runs = path.read_text().count("ran") if path.exists() else 0
    with open(path, "a") as f:
        f.write("ran\n")
    if runs == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


OPTIONS = dict(kinetic_conn_id=CONN, deferrable=False, poll_interval=0.2, requirements=[])

if ExceptionRetryPolicy is not None:
    POLICY = ExceptionRetryPolicy(
        rules=[
            RetryRule(exception=KineticUserError, action=RetryAction.FAIL, reason="a bug"),
            RetryRule(
                exception=KineticInfraError,
                action=RetryAction.RETRY,
                retry_delay=timedelta(0),
                reason="the platform failed",
            ),
        ]
    )
    with DAG("kinetic_retry_policy", schedule=None, start_date=START, catchup=False) as policy:
        for task_id, func in (("bug", a_bug), ("flaky_node", killed_once)):
            KineticRunOperator(
                task_id=task_id,
                python_callable=func,
                op_args=[MARKER],
                retries=3,
                retry_delay=timedelta(0),
                retry_policy=POLICY,
                **OPTIONS,
            )

with DAG("kinetic_retry_on", schedule=None, start_date=START, catchup=False) as retry_on:
    for task_id, func in (("bug", a_bug), ("flaky_node", killed_once)):
        KineticRunOperator(
            task_id=task_id,
            python_callable=func,
            op_args=[MARKER],
            retries=0,
            retry_on={"infra": 1, "user_error": 0},
            **OPTIONS,
        )
