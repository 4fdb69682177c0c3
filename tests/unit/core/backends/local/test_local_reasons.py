"""The first error a local job's process printed, as its failure reason names it, and
the reason's bound whatever was printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local import reasons as local_reasons
from airflow_provider_kinetic.core.backends.local.reasons import first_error

NO_PROVIDER = "ModuleNotFoundError: No module named 'airflow_provider_kinetic'"


@pytest.mark.parametrize(
    "log, error",
    [
        (  # python -m airflow_provider_kinetic.X without the package
            "/v/bin/python: Error while finding module specification for "
            f"'airflow_provider_kinetic.runner' ({NO_PROVIDER})\n",
            NO_PROVIDER,
        ),
        ("/v/bin/python: No module named nothere\n", "No module named nothere"),
        (
            "Traceback (most recent call last):\n"
            '  File "x.py", line 1, in <module>\n'
            "    import cloudpickle\n"
            "ModuleNotFoundError: No module named 'cloudpickle'\n"
            "\n"
            "During handling of the above exception, another exception occurred:\n"
            "\n"
            "Traceback (most recent call last):\n"
            "RuntimeError: later\n",
            "ModuleNotFoundError: No module named 'cloudpickle'",
        ),
        (
            "kinetic: queued: 1 job ahead\n"
            "Fatal Python error: init_fs_encoding: failed to get the Python codec\n"
            "ModuleNotFoundError: No module named 'encodings'\n",
            "Fatal Python error: init_fs_encoding: failed to get the Python codec",
        ),
        ("kinetic: queued: 1 job ahead\nkinetic: job slot free after 2.0s queued\n", None),
        ("", None),
        ("Traceback (most recent call last):\n", None),  # cut off: nothing certain
    ],
)
def test_first_error(log: str, error: str | None) -> None:
    assert first_error(log) == error


def job_dir(tmp_path: Path, log: str, python: str = "/v/bin/python") -> str:
    (tmp_path / "log").write_text(log)
    spec = {"argv": [python + "-runner", "-m", "x"], local_reasons.PYTHON_KEY: python}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return str(tmp_path)


def test_reasons_read_from_a_job_dir(tmp_path: Path) -> None:
    jdir = job_dir(
        tmp_path,
        f"/v/bin/python: Error while finding module specification for 'x' ({NO_PROVIDER})\n",
    )
    assert (
        local_reasons.vanished(jdir) == f"never started: {NO_PROVIDER} (interpreter /v/bin/python)"
    )
    assert local_reasons.exited(jdir, 1) == (
        f"exit code 1 before the runner started: {NO_PROVIDER} (interpreter /v/bin/python-runner)"
    )
    assert local_reasons.exited(jdir, -9) == "killed by SIGKILL"
    assert local_reasons.exited(jdir, -200) == "killed by signal 200"


def test_a_runner_that_started_is_not_a_start_up_failure(tmp_path: Path) -> None:
    log = (
        "[kinetic-runner] kinetic runner starting (host 0, pid 7)\n"
        "Traceback (most recent call last):\nValueError: x\n"
    )
    jdir = job_dir(tmp_path, log)
    assert local_reasons.exited(jdir, 1) == "exit code 1"
    assert "killed" in local_reasons.vanished(jdir)  # its supervisor died silently


def test_no_log_no_spec(tmp_path: Path) -> None:
    assert local_reasons.exited(str(tmp_path), 3) == "exit code 3"
    assert "killed" in local_reasons.vanished(str(tmp_path))


def test_the_reason_is_bounded(tmp_path: Path) -> None:
    long_path = "/" + "d" * 5000 + "/bin/python"
    jdir = job_dir(
        tmp_path, "Traceback (most recent call last):\nOSError: " + "x" * 100_000 + "\n", long_path
    )
    reason = local_reasons.vanished(jdir)
    assert len(reason) <= local_reasons.REASON_MAX
    assert reason.startswith("never started: OSError: xxx") and "/bin/python)" in reason
