"""Run dags_examples/retrain_daily.py once with Airflow's dag.test() and print its metrics.

Uses a private AIRFLOW_HOME (``.artifacts/airflow-home`` unless AIRFLOW_HOME is set)
and no kinetic connection, so the embedded local backend runs the training job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--date", default="2026-11-20", help="logical date (ds) of the run")
    ns = parser.parse_args()
    home = Path(os.environ.get("AIRFLOW_HOME", REPO / ".artifacts" / "airflow-home")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "KINETIC_EXAMPLE_DATA_ROOT": str(home / "example-data"),
        }
    )
    print(f"AIRFLOW_HOME={home}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL
    )

    import pendulum
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    sys.path.insert(0, str(REPO / "dags_examples"))
    from retrain_daily import dag

    dr = dag.test(logical_date=pendulum.parse(ns.date))
    with create_session() as session:
        rows = session.query(XComModel).filter(
            XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id
        )
        xcoms = {(r.task_id, r.key): XComModel.deserialize_value(r) for r in rows}
    import airflow_provider_kinetic

    print(f"\nDAG run {dr.run_id}: {dr.state}")
    # Which install ran it: this checkout (the editable install) or an installed wheel.
    print("provider:   ", Path(airflow_provider_kinetic.__file__).parent)
    if dr.state != "success":
        return 1
    print("kinetic job:", json.dumps(xcoms[("train", "kinetic_job")], sort_keys=True))
    print("output dir: ", xcoms[("train", "output_dir")])
    print("metrics:    ", json.dumps(xcoms[("train", "return_value")], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
