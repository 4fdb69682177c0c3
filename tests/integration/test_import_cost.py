"""What a local DAG file loads when it imports the provider, in a fresh interpreter.

Airflow's DAG processor has already imported Airflow before it runs a DAG file, so the
probe imports ``airflow.sdk`` first and looks only at what a local DAG file adds on top
of it: the modules that appear in ``sys.modules``.  The Kubernetes and Google clients
(seconds of import) must not load for a DAG that runs locally, and the DAG must be
built from this package.  What the import costs in time is a speed goal, measured by
``benchmarks/run.py`` (the ``DAG file import above airflow.sdk`` row, under 0.5 s),
not asserted here: a wall-clock budget fails by chance on a loaded machine.

The comparison is against what ``airflow.sdk`` already loaded, not an absolute list:
a ``google-cloud-*`` namespace ``.pth`` file puts ``google.cloud`` into ``sys.modules``
at interpreter start-up, before any import of ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Modules a local DAG must not load (the GKE backend's and gs:// store's clients).
HEAVY = ("kubernetes", "kubernetes_asyncio", "google.cloud", "airflow.providers.google",
         "airflow.providers.cncf")  # fmt: skip

DAG_FILE = '''
"""A local DAG: the operator on local Data, a map, and @task.kinetic."""
import datetime
import os

from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator


def count(folder):
    return len(os.listdir(folder))


def square(i):
    return i * i


with DAG("import_cost", schedule=None, catchup=False,
         start_date=datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)) as dag:
    KineticRunOperator(task_id="count", python_callable=count,
                       op_args=[Data(os.environ["IMPORT_COST_DATA"])])
    KineticMapOperator(task_id="squares", python_callable=square, inputs=[1, 2, 3])

    @task.kinetic(accelerator="cpu")
    def one():
        return 1

    one()
'''

PROBE = """
import importlib.util, json, sys
import airflow.sdk  # what the DAG processor has imported before it runs a DAG file
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("import_cost_dag", sys.argv[1])
dag_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dag_module)
import airflow_provider_kinetic as kinetic
public = {name: getattr(kinetic, name) for name in kinetic.__all__}
print(json.dumps({
    "new": sorted(set(sys.modules) - before),  # the DAG file's and the public names'
    "tasks": {t.task_id: type(t).__module__ for t in dag_module.dag.tasks},
    "public": sorted(public),
    "all": sorted(kinetic.__all__),
}))
"""


def _probe(tmp_path: Path) -> dict:
    dag = tmp_path / "import_cost_dag.py"
    dag.write_text(DAG_FILE)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("a\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "_AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow-home"), "IMPORT_COST_DATA": str(data),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_local_dag_imports_no_cluster_clients(tmp_path):
    result = _probe(tmp_path)
    heavy = [m for m in result["new"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], heavy
    # The DAG file imported the provider (the modules above are what it loads) ...
    assert "airflow_provider_kinetic.operators.run" in result["new"]
    # ... and the DAG really was built from this package (the decorator resolved to ours).
    assert result["tasks"] == {
        "count": "airflow_provider_kinetic.operators.run",
        "squares": "airflow_provider_kinetic.operators.map",
        "one": "airflow_provider_kinetic.decorators.kinetic",
    }
    assert result["public"] == result["all"] and "KineticHook" in result["public"]
