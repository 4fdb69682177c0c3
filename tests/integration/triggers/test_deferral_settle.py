"""Under ``dag.test()`` a deferred task's trigger runs inline, in the process that
deferred it: no executor reports that exit late, so the trigger holds nothing
(``triggers.settle``).  A real ``dag.test()`` run of deferred jobs, with the hold made
ten minutes long; a hold that would wait is recorded instead of waited (the settle
module's sleep), so the test says so at once rather than by the run's duration."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pendulum
import pytest

from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.deferral import release_on_defer

LOGICAL = pendulum.datetime(2026, 11, 21, tz="UTC")


@pytest.mark.timeout(600)
def test_dag_test_deferrals_are_not_held(
    load_dag, capfd, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from airflow_provider_kinetic.triggers import settle
    from airflow_provider_kinetic.triggers.settle import settle_s

    holds: list[float] = []

    async def hold_recorded(seconds: float) -> None:
        holds.append(seconds)

    monkeypatch.setattr(settle, "asyncio", SimpleNamespace(sleep=hold_recorded))
    monkeypatch.setenv("AIRFLOW__KINETIC__DEFER_GRACE_S", "0")  # defer at once
    monkeypatch.setenv("AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL", "600")
    assert settle_s() == 603.0
    dag = load_dag("kinetic_first_hour_dags.py", "kinetic_first_hour_callables")
    release = tmp_path / "release"  # each job holds until its task has deferred
    seen = release_on_defer(monkeypatch, release)
    dr = dag.test(logical_date=LOGICAL, run_conf={"release_dir": str(release)})
    out = "".join(capfd.readouterr())
    assert seen == {"partial_add", "bound_greet"}, out[-5000:]
    assert dr.state == "success", (task_states(dr), out[-5000:])
    assert out.count("Pausing task as DEFERRED") == 2, out[-5000:]  # both deferred
    assert "KineticJobTrigger" in out
    values = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    assert values["partial_add", "return_value"] == 42
    # Neither trigger held its event (a triggerer would hold it 603 s after deferring).
    assert holds == []
