"""A job, and a batch's child, that leave links in their output dirs (issue 38, case 1):
tests/integration/test_standalone.py asks the Kinetic pages, as the simple auth
manager's viewer, for the files they lead to."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator


def leaves_links(airflow_home: str) -> int:
    """Write ``metrics.json`` and leave links beside it: to ``/etc/passwd``, to the
    simple auth manager's password file and to ``$AIRFLOW_HOME`` itself (all outside
    the store, which is ``$AIRFLOW_HOME/kinetic``), and to ``metrics.json`` (inside)."""
    import os

    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        f.write('{"ok": true}')
    passwords = os.path.join(airflow_home, "simple_auth_manager_passwords.json.generated")
    os.symlink("/etc/passwd", os.path.join(out, "passwd"))
    os.symlink(passwords, os.path.join(out, "passwords.json"))
    os.symlink(airflow_home, os.path.join(out, "home"))
    os.symlink("metrics.json", os.path.join(out, "alias.json"))
    return 1


with DAG(
    "kinetic_links",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
):
    KineticRunOperator(
        task_id="links",
        python_callable=leaves_links,
        op_args=[os.environ["AIRFLOW_HOME"]],
        deferrable=False,
    )
    KineticMapOperator(
        task_id="links_map",
        python_callable=leaves_links,
        inputs=[os.environ["AIRFLOW_HOME"]],
        deferrable=False,
        poll_interval=0.5,
    )
