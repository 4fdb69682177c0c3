"""Times the DAGs of ``overhead_dags.py`` with ``dag.test()``: ``overhead_child.py REPEAT``.

Runs in a process of its own because Airflow reads its configuration once, at import:
the parent (``cases_overhead.py``) points ``AIRFLOW_HOME`` and the DAGs folder at a
private temp dir first.  Every DAG runs once as a warm-up (imports, the first DB
queries and the first job's cold start do not count), then ``REPEAT`` times,
interleaved.  A task's time is its task instance's duration as Airflow records it
(start to end, the deferral included), so the DAG run's own bookkeeping, which is the
same for every DAG, is not in it.  Prints one JSON line:
``{dag_id: {"durations": [...], "states": [...], "phases": [...]}}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

DAG_IDS = (
    "overhead_plain",
    "overhead_sync",
    "overhead_deferrable",
    "overhead_plain_7s",
    "overhead_deferred_7s",
    "overhead_airflow_defer_7s",
)  # and overhead_sweep, once (sweep_gaps)
#: The DAG whose function records its own start and end (``phases``).
PHASED = "overhead_deferred_7s"


def load_dags() -> dict[str, Any]:
    """The DAGs, imported from the DAGs folder (``dag.test()`` runs only DAGs it can find
    in a bundle, so they must come from there)."""
    from airflow.sdk import DAG

    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "overhead_dags.py"
    spec = importlib.util.spec_from_file_location("overhead_dags", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["overhead_dags"] = module
    spec.loader.exec_module(module)
    return {d.dag_id: d for d in vars(module).values() if isinstance(d, DAG)}


def task_time(dag: Any) -> tuple[float, str, dict[str, float]]:
    """Run ``dag`` once; its one task's recorded duration, final state and, for
    ``PHASED``, the time before its function started and after it ended."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dr = dag.test()
    with create_session() as session:
        (ti,) = session.query(TaskInstance).filter(
            TaskInstance.dag_id == dag.dag_id, TaskInstance.run_id == dr.run_id
        )
        split = phases(dag.dag_id, dr.run_id, ti) if dag.dag_id == PHASED else {}
        return float(ti.duration or 0.0), str(ti.state), split


def phases(dag_id: str, run_id: str, ti: Any) -> dict[str, float]:
    """The task's start until its function started (submit, the runner's start), and the
    function's end until the task ended (noticing the end, the trigger's event, the
    resumed task collecting), from the ``times.json`` the function wrote."""
    from urllib.parse import unquote, urlparse

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        (row,) = session.query(XComModel).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == "output_dir"
        )
        out = XComModel.deserialize_value(row)
    times = json.loads(Path(unquote(urlparse(out).path), "times.json").read_text())
    return {
        "before": times["start"] - ti.start_date.timestamp(),
        "after": ti.end_date.timestamp() - times["end"],
    }


def main() -> int:
    repeat = int(sys.argv[1])
    dags = load_dags()
    out: dict[str, dict[str, list[Any]]] = {
        d: {"durations": [], "states": [], "phases": []} for d in DAG_IDS
    }
    for dag_id in DAG_IDS:  # warm-up (imports, first parse); the long ones need none
        if not dag_id.endswith("7s"):
            task_time(dags[dag_id])
    for _ in range(repeat):
        for dag_id in DAG_IDS:
            seconds, state, split = task_time(dags[dag_id])
            out[dag_id]["durations"].append(seconds)
            out[dag_id]["states"].append(state)
            out[dag_id]["phases"].append(split)
    out["sweep"] = sweep_gaps(dags["overhead_sweep"])  # once: it takes about 30 s
    print(json.dumps(out))
    return 0


def sweep_gaps(dag: Any) -> dict[str, Any]:
    """Run the deferrable sweep once; each freed slot's wait until a child started in it.

    The children's own times (``times.json`` in each child's output dir, found through
    the ``kinetic_output_dirs`` XCom): the slot freed by the i-th child to end is the
    one the (slots + i)-th child to start took."""
    from urllib.parse import unquote, urlparse

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dr = dag.test()
    with create_session() as session:
        (row,) = session.query(XComModel).filter(
            XComModel.dag_id == dag.dag_id,
            XComModel.run_id == dr.run_id,
            XComModel.key == "kinetic_output_dirs",
        )
        dirs = XComModel.deserialize_value(row)
    times = [json.loads(Path(unquote(urlparse(d).path), "times.json").read_text()) for d in dirs]
    starts = sorted(t["start"] for t in times)
    ends = sorted(t["end"] for t in times)
    slots = dag.get_task("sweep").max_concurrent
    gaps = [starts[slots + i] - ends[i] for i in range(len(starts) - slots)]
    return {"gaps": gaps, "state": str(dr.state), "poll_s": dag.get_task("sweep").poll_interval}


if __name__ == "__main__":
    sys.exit(main())
