"""``airflow kinetic jobs list`` by task: run id, logical date, map index and batch
children, over jobs and batches that operators ran on the local backend (the fixtures
and helpers of ``test_cli``: the CLI's ``main`` called in this process)."""

from __future__ import annotations

from typing import Any

from airflow_provider_kinetic.core.config import KineticConfig
from tests.integration.cli import test_cli
from tests.integration.cli.test_cli import CONN, add, as_json, cli

#: A local connection named CONN, as ``test_cli``'s tests use it.
config = test_cli.config


def square(i: int) -> int:
    print("child", i, flush=True)
    return i * i


def _task_run(task_id: str, run_id: str, logical: str | None, map_index: int, **op: Any) -> Any:
    """Run one operator as task ``task_id`` of DAG ``ids`` (in this process, like a
    worker would), its logical date in the context as Airflow passes it."""
    from datetime import datetime

    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
    from tests.fixtures.fake_ti import FakeTI

    ti = FakeTI(dag_id="ids", task_id=task_id, run_id=run_id, map_index=map_index)
    kind = KineticMapOperator if "inputs" in op else KineticRunOperator
    task = kind(task_id=task_id, kinetic_conn_id=CONN, poll_interval=0.1, **op)
    date = datetime.fromisoformat(logical) if logical else None
    return task.execute({"ti": ti, "logical_date": date})


def test_list_shows_and_filters_by_run_id_logical_date_and_map_index(config: KineticConfig):
    """Exact ids as Airflow shows them (a run id with ":" and "+", never its store key
    form), the logical date (blank for a run without one), map index columns and
    filters; ``--children`` follows a batch's row with its children by input index."""
    backfill = "backfill__2026-11-21T00:00:00+00:00"
    _task_run("one", backfill, "2026-11-21T00:00:00+00:00", 3, python_callable=add,
              op_args=[1, 2])  # fmt: skip
    _task_run("two", "manual__x", None, -1, python_callable=add, op_args=[3, 4])
    _task_run("sweep", backfill, "2026-11-21T00:00:00+00:00", -1, python_callable=square,
              inputs=[0, 1, 2])  # fmt: skip

    rows = as_json("jobs", "list")
    by_task = {r["task_id"]: r for r in rows}
    assert by_task["one"]["run_id"] == backfill and by_task["one"]["map_index"] == 3
    assert by_task["one"]["logical_date"] == "2026-11-21T00:00:00+00:00"
    assert by_task["two"]["logical_date"] is None and by_task["sweep"]["kind"] == "batch"
    table = cli("jobs", "list").stdout
    head = table.splitlines()[0].split()
    assert head[4:9] == ["DAG_ID", "TASK_ID", "RUN_ID", "LOGICAL_DATE", "MAP_INDEX"]
    assert backfill in table and "00_00_00" not in table  # never the key form

    def tasks(*args: str) -> list[str]:
        return sorted(r["task_id"] for r in as_json("jobs", "list", *args))

    assert tasks("--run-id", backfill) == ["one", "sweep"]
    assert tasks("--run-id", "backfill__2026-11-21T00_00_00_00_00") == []
    assert tasks("--logical-date", "2026-11-21") == ["one", "sweep"]
    assert tasks("--logical-date", "2026-11-21T00:00:00Z") == ["one", "sweep"]
    assert tasks("--logical-date", "2026-11-22") == []
    assert tasks("--map-index", "3") == ["one"]
    assert tasks("--map-index", "-1", "--run-id", backfill) == ["sweep"]
    bad = cli("jobs", "list", "--logical-date", "yesterday", ok=False)
    assert bad.returncode == 1 and "--logical-date 'yesterday'" in bad.stderr

    expanded = as_json("jobs", "list", "--children", "--run-id", backfill, "--map-index", "-1")
    assert [(r["kind"], r["child"]) for r in expanded] == [
        ("batch", None), ("child", 0), ("child", 1), ("child", 2),
    ]  # fmt: skip
    batch = expanded[0]
    for row in expanded[1:]:
        assert row["group_id"] == batch["job_id"] and row["state"] == "SUCCEEDED"
        assert (row["run_id"], row["logical_date"]) == (backfill, batch["logical_date"])
    table = cli("jobs", "list", "--children", "--run-id", backfill).stdout.splitlines()
    assert table[0].split()[8:10] == ["MAP_INDEX", "CHILD"]
    assert any(line.startswith(expanded[3]["job_id"]) for line in table)
