"""The job context and requirements venvs on the local backend, end to end.

Real parts only: a real project directory, the real runner in a detached local
process, real ``uv`` building venvs from a wheel written into tmp (no index, no
network: ``KINETIC_LOCAL_FIND_LINKS``) and real ``dag.test()`` runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_provider_kinetic.core.backends.local.backend import STATE_DIR, LocalBackend
from airflow_provider_kinetic.core.backends.local.venv import VENV_DIR
from airflow_provider_kinetic.core.batch import launch as batchlaunch
from airflow_provider_kinetic.core.batch.plan import plan_batch
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.results import collect
from airflow_provider_kinetic.core.jobs.submit import submit_job
from airflow_provider_kinetic.core.runtime.context import CONTEXT_CACHE, ContextTooLargeError
from airflow_provider_kinetic.core.spec.handles import JobHandle, JobStatus
from airflow_provider_kinetic.core.storage import LocalStore
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.tiny_wheel import write_wheel

LOGICAL = pendulum.datetime(2026, 11, 20, tz="UTC")
#: A stand-in for the example's ``tabulate`` (same call), installable offline.
TABULATE = """
def tabulate(rows, headers=()):
    lines = [" | ".join(map(str, headers))] if headers else []
    return "\\n".join(lines + [" | ".join(map(str, row)) for row in rows])
"""


class CountingStore(LocalStore):
    """A real LocalStore that records every key written."""

    def __init__(self, root: str):
        super().__init__(root)
        self.writes: list[str] = []

    def write_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        self.writes.append(key)
        super().write_bytes(key, data, **kwargs)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    write_wheel(out, "tabulate", "0.0.1", {"tabulate/__init__.py": TABULATE})
    return out


@pytest.fixture
def offline_uv(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """uv sees only the tmp wheels: no index, no network."""
    monkeypatch.setenv("KINETIC_LOCAL_FIND_LINKS", str(wheels))
    return wheels


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A DAG project with a helper file the job opens by relative path."""
    root = tmp_path / "proj"
    (root / "assets").mkdir(parents=True)
    (root / "setup.cfg").write_text("")  # a root marker with no requirements
    (root / "dag.py").write_text("# the DAG file\n")
    (root / "assets" / "labels.txt").write_text("cat\ndog\nbird\n")
    (root / "projhelper.py").write_text("VALUE = 42\n")  # importable: the root is on sys.path
    return root


def read_labels() -> dict:
    import projhelper  # not importable here: only from the job's context

    with open("assets/labels.txt") as f:
        return {"labels": f.read().split(), "cwd": os.getcwd(), "helper": projhelper.VALUE}


def interpreter() -> str:
    import sys

    return sys.executable


def use_tabulate() -> dict:
    import sys

    import tabulate

    return {
        "module": tabulate.__file__,
        "python": sys.executable,
        "table": tabulate.tabulate([[1]]),
    }


def run_to_end(backend: LocalBackend, store: LocalStore, handle: JobHandle) -> Any:
    backend.wait([handle], 120)  # wakes when the job's exit code is written
    report = backend.status(handle)
    assert report.status.is_terminal, report.describe()
    assert report.status is JobStatus.SUCCEEDED, backend.read_logs(handle)[0]
    return collect(store, handle.job_id, report.status)


def context_arg(spec: Any) -> str:
    return spec.args[spec.args.index("--context-gcs") + 1]


# ---- the context ------------------------------------------------------------------------


def test_helper_file_opens_by_relative_path_and_the_context_uploads_once(config, backend, project):
    store = CountingStore(config.bucket_name)
    request = JobRequest(func=read_labels, entry_file=str(project / "dag.py"))
    handle, spec = submit_job(request, config, backend, store)
    first = list(store.writes)
    result = run_to_end(backend, store, handle)
    assert result["labels"] == ["cat", "dog", "bird"] and result["helper"] == 42
    # The job ran in its own extracted copy of the project, not in the client's dir.
    assert result["cwd"].endswith("/workspace") and str(project) not in result["cwd"]
    store.writes.clear()
    handle2, spec2 = submit_job(request, config, backend, store)
    assert run_to_end(backend, store, handle2)["labels"] == ["cat", "dog", "bird"]
    contexts = [k for k in first if k.startswith(CONTEXT_CACHE)]
    assert len(contexts) == 1 and context_arg(spec) == store.uri(contexts[0])
    # The second job reuses the cached context: no context write at all.
    assert [k for k in store.writes if k.startswith(CONTEXT_CACHE)] == []
    assert context_arg(spec2) == context_arg(spec)
    assert not [k for k in store.list(f"{handle2.job_id}/") if k.endswith("context.zip")]


def test_a_changed_helper_file_is_a_new_context(config, backend, project):
    store = CountingStore(config.bucket_name)
    request = JobRequest(func=read_labels, entry_file=str(project / "dag.py"))
    first, spec = submit_job(request, config, backend, store)
    assert run_to_end(backend, store, first)["labels"] == ["cat", "dog", "bird"]
    (project / "assets" / "labels.txt").write_text("fish\n")
    handle, spec2 = submit_job(request, config, backend, store)
    assert context_arg(spec2) != context_arg(spec)
    assert run_to_end(backend, store, handle)["labels"] == ["fish"]


def test_an_oversized_context_fails_before_any_upload(config, backend, project):
    (project / "assets" / "weights.bin").write_bytes(b"w" * 300_000)
    store = CountingStore(config.bucket_name)
    request = JobRequest(func=read_labels, entry_file=str(project / "dag.py"), max_context_mb=0.2)
    with pytest.raises(ContextTooLargeError, match=r"assets/weights\.bin"):
        submit_job(request, config, backend, store)
    assert store.writes == [] and not Path(config.bucket_name, STATE_DIR).exists()


def test_batch_children_share_one_context(config, project):
    store = CountingStore(config.bucket_name)
    request = JobRequest(func=read_labels, entry_file=str(project / "dag.py"))
    specs = []
    for _ in range(2):  # two batches of the same content: one context upload in all
        state, objects, local = plan_batch(
            request, [1, 2, 3], "single", store, config=config,
            max_concurrent=3, retries=0, fail_fast=False,
        )  # fmt: skip
        batchlaunch.start_batch(state, objects, local, store)
        specs += [
            batchlaunch.child_spec(state, i, f"job-c{i:07d}", config, store, None) for i in range(3)
        ]
    assert len({context_arg(s) for s in specs}) == 1
    assert len([k for k in store.writes if k.startswith(CONTEXT_CACHE)]) == 1
    assert store.list(CONTEXT_CACHE + "/") == [context_arg(specs[0]).split(store.bucket + "/")[1]]


# ---- requirements venvs -------------------------------------------------------------------


def test_requirements_venv_is_built_once_and_reused(config, backend, offline_uv, caplog):
    store = LocalStore(config.bucket_name)
    request = JobRequest(func=use_tabulate, requirements=["tabulate"])
    with caplog.at_level(logging.INFO, logger="airflow_provider_kinetic"):
        handle, _ = submit_job(request, config, backend, store)
        first = run_to_end(backend, store, handle)
        built = caplog.text
        caplog.clear()
        handle2, _ = submit_job(request, config, backend, store)
        second = run_to_end(backend, store, handle2)
    venvs = Path(config.bucket_name, VENV_DIR)
    (venv,) = [p for p in venvs.iterdir() if p.is_dir()]
    assert "building venv for requirements" in built and "(1 packages)" in built
    assert "building venv" not in caplog.text and "reusing venv" in caplog.text
    for result in (first, second):
        assert result["module"].startswith(str(venv)) and result["python"].startswith(str(venv))
        assert result["table"] == "1"
    assert not [p for p in venvs.iterdir() if p.name.startswith(".build-")]


def test_without_requirements_the_worker_interpreter_runs_the_job(config, backend):
    import sys

    store = LocalStore(config.bucket_name)
    handle, spec = submit_job(JobRequest(func=interpreter), config, backend, store)
    assert run_to_end(backend, store, handle) == sys.executable
    assert spec.requirements == []
    assert not Path(config.bucket_name, VENV_DIR).exists()


# ---- under dag.test() ---------------------------------------------------------------------


def test_example_reads_its_asset_and_imports_its_requirement(load_dag, offline_uv):
    dr = load_dag("with_assets/with_assets.py", "with_assets").test(logical_date=LOGICAL)
    states = {t: s for (t, _), s in task_states(dr).items()}
    assert dr.state == "success", states
    x = {(t, k): v for (t, k, _), v in xcoms(dr).items()}
    result = x[("label_report", "return_value")]
    assert result["labels"] == ["cat", "dog", "bird"]
    assert f"/{VENV_DIR}/" in result["tabulate_from"] and f"/{VENV_DIR}/" in result["python"]
    assert result["table"].splitlines()[0] == "id | label"
    assert x[("show", "return_value")] == 3


def test_missing_requirement_fails_with_uvs_error_in_the_task_log(
    load_dag, offline_uv, capfd, caplog
):
    dr = load_dag("venv_missing/venv_missing.py", "kinetic_venv_missing").test(logical_date=LOGICAL)
    assert {t: s for (t, _), s in task_states(dr).items()} == {"needs_missing": "failed"}
    log = "".join(capfd.readouterr()) + caplog.text
    assert "building venv for requirements" in log
    assert "kinetic-test-missing-pkg was not found" in log
    assert "installing the job's requirements failed" in log


def test_concurrent_jobs_wait_for_one_venv_build(tmp_path, offline_uv, caplog):
    """Three submitters at once (a batch's children): one build under the lock, the
    others reuse it; no scratch dir is left."""
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_kinetic.core.backends.local import venv as local_venv

    root = str(tmp_path / "root")
    with (
        caplog.at_level(logging.INFO, logger="airflow_provider_kinetic"),
        ThreadPoolExecutor(3) as pool,
    ):
        venvs = list(pool.map(lambda _: local_venv.ensure_venv(root, ["tabulate"]), range(3)))
    assert len(set(venvs)) == 1 and Path(venvs[0], "bin", "python").exists()
    assert caplog.text.count("building venv for requirements") == 1
    assert caplog.text.count("reusing venv") == 2
    assert sorted(p.name for p in Path(root, VENV_DIR).iterdir() if p.name.startswith(".")) == []
