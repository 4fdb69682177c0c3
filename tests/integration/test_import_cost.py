"""What a DAG file pays to import the provider, measured in a fresh interpreter.

Airflow's DAG processor has already imported Airflow (``import airflow.sdk`` alone takes
about 2 s here, and none of it is ours) before it runs a DAG file, so the probe imports
``airflow.sdk`` first and counts only what a local DAG file adds on top of it: the
``-X importtime`` entries after that point (every module first imported on the DAG's
behalf, this package's and the stdlib or Airflow modules it pulls in) and the modules
that appear in ``sys.modules``.  A DagBag with many DAG files parses each under a
timeout, so this cost is paid per file: it must stay small, and the Kubernetes and
Google clients (seconds of import) must not load for a DAG that runs locally.  The
probe also freezes the garbage collector after importing Airflow, as the DAG
processor does before it forks its parsers; without that, a full collection over
Airflow's objects (about 80 ms here) lands on whichever module happens to be importing.

The comparison is against what ``airflow.sdk`` already loaded, not an absolute list:
a ``google-cloud-*`` namespace ``.pth`` file puts ``google.cloud`` into ``sys.modules``
at interpreter start-up, before any import of ours.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: Seconds of import a DAG file may add above an imported ``airflow.sdk``.
BUDGET_S = 0.5
#: Modules a local DAG must not load (the GKE backend's and gs:// store's clients).
HEAVY = ("kubernetes", "kubernetes_asyncio", "google.cloud", "airflow.providers.google",
         "airflow.providers.cncf")  # fmt: skip
MARK = "KINETIC-DAG-IMPORT-STARTS"

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

PROBE = f"""
import gc, importlib.util, json, sys, time
import airflow.sdk  # what the DAG processor has imported before it runs a DAG file
# ... and frozen (airflow/dag_processing/manager.py, before it forks the parsers): a
# garbage collection then never walks Airflow's own objects on the DAG file's time.
gc.freeze()
before = set(sys.modules)
print({MARK!r}, file=sys.stderr, flush=True)
start = time.perf_counter()
spec = importlib.util.spec_from_file_location("import_cost_dag", sys.argv[1])
dag_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dag_module)
import airflow_provider_kinetic as kinetic
public = {{name: getattr(kinetic, name) for name in kinetic.__all__}}
wall = time.perf_counter() - start
print(json.dumps({{
    "wall": wall,
    "new": sorted(set(sys.modules) - before),
    "tasks": {{t.task_id: type(t).__module__ for t in dag_module.dag.tasks}},
    "public": sorted(public),
    "all": sorted(kinetic.__all__),
}}))
"""


def _top_level_import_s(stderr: str) -> tuple[float, list[tuple[float, str]]]:
    """Seconds of the ``-X importtime`` entries after the mark, and the largest.

    Nested entries are inside their top-level entry's cumulative time, so only the
    top-level ones (no indent) are summed."""
    _, found, after = stderr.partition(MARK)
    assert found, stderr[-2000:]
    top = []
    for line in after.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m:
            top.append((int(m.group(1)) / 1e6, m.group(2)))
    return sum(s for s, _ in top), sorted(top, reverse=True)[:8]


def _probe(tmp_path: Path) -> tuple[dict, float, list]:
    dag = tmp_path / "import_cost_dag.py"
    dag.write_text(DAG_FILE)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("a\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "_AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow-home"), "IMPORT_COST_DATA": str(data),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE, str(dag)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 0, "\n".join(errors)[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    total, largest = _top_level_import_s(done.stderr)
    return result, total, largest


def test_a_local_dag_imports_no_cluster_clients_and_costs_under_half_a_second(tmp_path):
    # Two fresh interpreters: the first also writes the .pyc files of any module edited
    # since the last run (a compile is not what a DAG processor pays on every parse);
    # the cheaper run is the measurement.
    runs = [_probe(tmp_path) for _ in range(2)]
    for result, _, _ in runs:
        heavy = [m for m in result["new"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
        assert heavy == [], heavy
        # The DAG really was built from this package (the decorator resolved to ours).
        assert result["tasks"] == {
            "count": "airflow_provider_kinetic.operators.run",
            "squares": "airflow_provider_kinetic.operators.map",
            "one": "airflow_provider_kinetic.decorators.kinetic",
        }
        assert result["public"] == result["all"] and "KineticHook" in result["public"]
    result, total, largest = min(runs, key=lambda run: run[1])
    assert 0 < total < BUDGET_S, (total, result["wall"], largest)
