"""An output dir and the ``Data`` made of it downstream are the same directory, on a
local store whose path holds a space, ``%``, ``#``, ``?`` and non-ASCII characters:
the first job writes into ``KINETIC_OUTPUT_DIR``, the second gets
``Data(<the output_dir URI as the XCom carries it>)`` and reads exactly that file."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.backends.local.backend import LocalBackend
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.spec.handles import JobStatus
from airflow_provider_kinetic.operators.common import directory_uri
from tests.fixtures.waiting import ended, wait_for

#: A space, "%41" (which a decoder would turn into "A"), "#", "?" and non-ASCII.
AWKWARD = "runs 50%41 #2 ?x=é"


def write_output(text: str) -> str:
    import os

    out = os.environ["KINETIC_OUTPUT_DIR"]
    os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
    with open(os.path.join(out, "ckpt", "model.txt"), "w") as f:
        f.write(text)
    return out


def read_back(folder: str) -> dict[str, str]:
    import os

    found = {}
    for d, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(d, name)) as f:
                found[os.path.relpath(os.path.join(d, name), folder)] = f.read()
    return found


def run(backend: LocalBackend, config: KineticConfig, request: JobRequest) -> tuple:
    handle, _ = submit_job(request, config, backend)
    report = wait_for(
        f"job {handle.job_id} to end",
        lambda: ended(backend.status(handle)),
        detail=lambda: backend.read_logs(handle)[0],
    )
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(handle)[0]
    return handle, collect(config.store(), handle.job_id, report.status)


@pytest.mark.parametrize("where", ["store root", "output_dir"])
def test_a_downstream_data_reads_what_the_job_wrote(tmp_path: Path, where: str) -> None:
    base = tmp_path / AWKWARD
    root, out_dir = base / "store", None
    if where == "output_dir":  # given by the user, spelled by the one rule
        root, out_dir = tmp_path / "plain-store", "file://" + urllib.parse.quote(str(base / "out"))
    config = KineticConfig(backend="local", root=str(root))
    backend = LocalBackend(config.bucket_name)
    first, wrote_in = run(
        backend, config, JobRequest(func=write_output, args=("weights",), output_dir=out_dir)
    )
    xcom = directory_uri(first.output_dir)  # what the output_dir XCom carries
    assert xcom is not None
    on_disk = Path(wrote_in, "ckpt", "model.txt")
    assert on_disk.read_text() == "weights"
    expected_parent = base / ("store" if where == "store root" else "out")
    assert Path(wrote_in).is_relative_to(expected_parent)
    _, value = run(backend, config, JobRequest(func=read_back, args=(Data(xcom),)))
    assert value == {os.path.join("ckpt", "model.txt"): "weights"}
    # Exactly one directory named by both: nothing written at another spelling.
    assert sorted(p.name for p in base.iterdir()) == ["store" if where == "store root" else "out"]
