"""The README's main command, as a user runs it from the checkout: the example
retraining DAG through ``scripts/run_example.py`` (what ``scripts/run-example.sh``
calls after bootstrapping), with the DAGs folder inside this repository, so the
repository's own ``pyproject.toml`` sits above it and must not be taken for the
DAG's requirements (nor its files for the job context)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_run_example_script_succeeds_from_the_checkout(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "_AIRFLOW"))}
    env["AIRFLOW_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_example.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert ": success" in out, out[-3000:]
    metrics = json.loads(out.split("metrics:", 1)[1].strip().splitlines()[0])
    assert metrics["rows"] == 512 and metrics["final_loss"] < metrics["initial_loss"] / 100
    # Run in the worker's interpreter: no requirements venv was built for the example.
    assert not (tmp_path / "home" / "kinetic" / ".local-venvs").exists()
