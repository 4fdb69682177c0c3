"""DAG file import case: what a local DAG file pays to import the provider.

Airflow's DAG processor has imported Airflow before it runs a DAG file (``import
airflow.sdk`` alone takes about 2 s, none of it ours) and frozen the garbage collector
before it forks its parsers, so each probe, a fresh interpreter, does the same and
then counts what the DAG file adds: the top-level ``-X importtime`` entries after that
point (every module first imported on the DAG's behalf).  A DagBag parses each file
under a timeout, so this is paid per file.  Goal: under ``MAX_S``.  The baseline is
the same DAG written with plain ``@task`` functions (what Airflow alone costs such a
file).  Which modules load (no Kubernetes or Google client for a local DAG, no
Airflow in the core or the runner) is the test suite's to prove
(``tests/integration/test_import_cost.py``); here a probe that loads one fails the row.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from table import Row

MAX_S = 0.5
#: Modules a local DAG must not load (the GKE backend's and gs:// store's clients).
HEAVY = ("kubernetes", "kubernetes_asyncio", "google.cloud", "airflow.providers.google",
         "airflow.providers.cncf")  # fmt: skip
MARK = "KINETIC-DAG-IMPORT-STARTS"

#: The DAG of ``tests/integration/test_import_cost.py``: the operator on local Data, a
#: map, and ``@task.kinetic``.
OURS = """
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
"""

#: The same three tasks as plain ``@task`` functions.
PLAIN = """
import datetime
import os

from airflow.sdk import DAG, task

with DAG("import_cost", schedule=None, catchup=False,
         start_date=datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)) as dag:

    @task
    def count(folder):
        return len(os.listdir(folder))

    @task
    def square(i):
        return i * i

    @task
    def one():
        return 1

    count(os.environ["IMPORT_COST_DATA"])
    square.expand(i=[1, 2, 3])
    one()
"""

PROBE = f"""
import gc, importlib.util, json, sys
import airflow.sdk  # what the DAG processor has imported before it runs a DAG file
gc.freeze()  # ... and frozen (airflow/dag_processing/manager.py, before it forks)
before = set(sys.modules)
print({MARK!r}, file=sys.stderr, flush=True)
spec = importlib.util.spec_from_file_location("import_cost_dag", sys.argv[1])
dag_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dag_module)
print(json.dumps({{"new": sorted(set(sys.modules) - before),
                  "tasks": len(dag_module.dag.tasks)}}))
"""


def top_level_s(stderr: str) -> tuple[float, list[tuple[float, str]]]:
    """Seconds of the top-level ``-X importtime`` entries after the mark (nested entries
    are inside their top-level entry's cumulative time), and the largest of them."""
    _, found, after = stderr.partition(MARK)
    if not found:
        raise RuntimeError(f"the import probe failed:\n{stderr[-3000:]}")
    top = []
    for line in after.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
        if m:
            top.append((int(m.group(1)) / 1e6, m.group(2)))
    return sum(s for s, _ in top), sorted(top, reverse=True)[:3]


def probe(dag_file: Path, tmp: Path) -> tuple[float, list[tuple[float, str]], list[str]]:
    """One fresh interpreter: the DAG file's import seconds, its largest imports and the
    heavy modules it loaded."""
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("a\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "_AIRFLOW"))}
    env.update({"AIRFLOW_HOME": str(tmp / "airflow-home"), "IMPORT_COST_DATA": str(data),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE, str(dag_file)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp,
    )  # fmt: skip
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if not line.startswith("import ")]
        raise RuntimeError(f"the import probe of {dag_file.name} failed:\n" + "\n".join(errors))
    new = json.loads(done.stdout.strip().splitlines()[-1])["new"]
    heavy = [m for m in new if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    return (*top_level_s(done.stderr), heavy)


def import_cost(tmp: Path, repeat: int) -> Row:
    """Best of ``repeat`` interleaved probes of each DAG file, after a warm-up probe of
    ours (it writes the .pyc files of modules edited since the last run: a compile is
    not what a DAG processor pays on every parse)."""
    tmp.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, text in (("ours", OURS), ("plain", PLAIN)):
        files[name] = tmp / f"import_cost_{name}.py"
        files[name].write_text(text)
    probe(files["ours"], tmp)
    runs: dict[str, list] = {"ours": [], "plain": []}
    for _ in range(repeat):
        for name in runs:
            runs[name].append(probe(files[name], tmp))
    t_base = min(r[0] for r in runs["plain"])
    t_ours, largest, _ = min(runs["ours"], key=lambda r: r[0])
    heavy = sorted({m for r in runs["ours"] for m in r[2]})
    top = ", ".join(f"{name} {s * 1000:.0f} ms" for s, name in largest)
    note = (
        f"-X importtime, top-level entries after an imported and frozen airflow.sdk, "
        f"best of {repeat} after a warm-up; largest: {top}"
    )
    note += f"; HEAVY MODULES LOADED: {', '.join(heavy[:5])}" if heavy else ""
    return Row(
        "DAG file import above airflow.sdk, local DAG (operator, map, @task.kinetic)",
        f"plain @task DAG file {t_base:.3f} s",
        f"{t_ours:.3f} s",
        None,
        f"< {MAX_S:g} s",
        not heavy and t_ours < MAX_S,
        note,
    )
