"""Requirements: given or discovered (kinetic's walk), JAX filtered, pod-unusable lines
refused before anything is uploaded, a stable hash."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.runtime.requirements import (
    RequirementsError,
    find_requirements,
    normalise_name,
    resolve_requirements,
)


def entry(tmp_path: Path, *parts: str) -> str:
    folder = tmp_path.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dag.py").write_text("")
    return str(folder / "dag.py")


def test_discovery_walks_up_and_requirements_txt_beats_pyproject(tmp_path):
    dag = entry(tmp_path, "proj", "dags", "sub")
    (tmp_path / "proj" / "pyproject.toml").write_text('[project]\ndependencies = ["rich>=13"]\n')
    assert find_requirements(str(Path(dag).parent), home=str(tmp_path)) == str(
        tmp_path / "proj" / "pyproject.toml"
    )
    reqs = resolve_requirements(None, dag, "cpu", "bundled")
    assert reqs.lines == ["rich>=13"] and reqs.source.endswith("pyproject.toml")
    (tmp_path / "proj" / "requirements.txt").write_text("numpy==2.1\n")
    assert resolve_requirements(None, dag, "cpu", "bundled").lines == ["numpy==2.1"]


def test_discovery_stops_at_git_and_home(tmp_path):
    (tmp_path / "requirements.txt").write_text("above-the-repo\n")
    dag = entry(tmp_path, "repo", "dags")
    (tmp_path / "repo" / ".git").mkdir()
    assert find_requirements(str(Path(dag).parent), home="/nonexistent") is None
    (tmp_path / "repo" / ".git").rmdir()
    assert find_requirements(str(Path(dag).parent), home=str(tmp_path / "repo")) is None
    assert find_requirements(str(Path(dag).parent), home="/nonexistent") == str(
        tmp_path / "requirements.txt"
    )


def test_jax_lines_are_dropped_by_normalised_name_unless_kept(tmp_path, caplog):
    lines = ["JAX[cuda12]==0.4.30", "jaxlib", "LibTPU_Nightly", "jax==0.4.1  # kn:keep", "optax"]
    with caplog.at_level(logging.WARNING):
        reqs = resolve_requirements(lines, None, "tpu", "prebuilt")
    assert reqs.lines == ["jax==0.4.1  # kn:keep", "optax"]
    assert "dropping 'LibTPU_Nightly'" in caplog.text and "tpu image" in caplog.text
    assert normalise_name("LibTPU_Nightly") == "libtpu-nightly"
    # The local backend keeps everything (its venv is on this machine).
    assert resolve_requirements(lines, None, "tpu", "local").lines == lines


@pytest.mark.parametrize(
    "line",
    [
        "-e ./mypkg",
        "-e .",
        "-r other.txt",
        "-c constraints.txt",
        "--requirement=base.txt",
        "file:///home/me/pkg",
        "./wheels/pkg.whl",
        "../sibling",
        "/abs/pkg.whl",
        "mypkg @ ./path",
        "mypkg @ file:///x",
        "--find-links ./wheels",
    ],
)
def test_lines_a_pod_cannot_install_are_refused_naming_the_line(line):
    with pytest.raises(RequirementsError) as err:
        resolve_requirements(["numpy", line], None, "cpu", "prebuilt")
    assert repr(line) in str(err.value) and "Allowed:" in str(err.value)


def test_remote_lines_that_work_are_kept_and_continuations_joined():
    lines = [
        "--index-url https://pypi.example/simple",
        "pkg @ https://example.com/pkg-1.0.tar.gz",
        "-e git+https://github.com/o/r.git#egg=r",
        "torch==2.3 \\",
        "    --hash=sha256:abc",
        "# a comment",
        "",
    ]
    reqs = resolve_requirements(lines, None, "gpu", "bundled")
    assert "torch==2.3      --hash=sha256:abc" in reqs.lines
    assert len(reqs.lines) == 5 and len(reqs.installable) == 4


def test_hash_is_stable_and_follows_the_filtered_lines(tmp_path):
    a = resolve_requirements(["numpy", "jax"], None, "cpu", "bundled")
    b = resolve_requirements(["numpy"], None, "cpu", "bundled")
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    assert resolve_requirements(["numpy==2"], None, "cpu", "bundled").sha256 != a.sha256


def test_a_file_path_is_read_relative_to_the_dag_and_a_bad_value_is_named(tmp_path):
    dag = entry(tmp_path, "proj")
    (tmp_path / "proj" / "reqs-prod.txt").write_text("pandas\n")
    assert resolve_requirements("reqs-prod.txt", dag, "cpu", "bundled").lines == ["pandas"]
    with pytest.raises(RequirementsError, match="'missing.txt': no such file"):
        resolve_requirements("missing.txt", dag, "cpu", "bundled")
    with pytest.raises(RequirementsError, match=r"3 \(int\) is not allowed"):
        resolve_requirements(["numpy", 3], dag, "cpu", "bundled")
    assert resolve_requirements([], dag, "cpu", "bundled").lines == []  # [] = none


def test_requirements_are_templated_on_both_operators(tmp_path):
    """``requirements=`` renders like the other fields (a per-run file, a pinned version
    from params) before the task resolves it."""
    import datetime as dt

    from airflow.sdk import DAG

    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

    with DAG("reqs_templated", schedule=None, start_date=dt.datetime(2026, 1, 1)):
        run = KineticRunOperator(
            task_id="run",
            python_callable=len,
            requirements=str(tmp_path / "reqs-{{ ds }}.txt"),
        )
        mapped = KineticMapOperator(
            task_id="map",
            python_callable=len,
            inputs=[[1]],
            requirements=["tabulate=={{ params.v }}"],
        )
    context = {"ds": "2026-11-01", "params": {"v": "0.9.0"}}
    run.render_template_fields(context)
    mapped.render_template_fields(context)
    assert run.requirements == str(tmp_path / "reqs-2026-11-01.txt")
    assert mapped.requirements == ["tabulate==0.9.0"]


def test_discovery_never_climbs_above_the_dags_folder(tmp_path):
    """A pyproject above the DAGs folder (the Airflow deployment's own, or this
    repository's for the example DAGs) is not the DAG's project: found without the
    ceiling, not with it; one inside the DAGs folder still is."""
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["apache-airflow"]\n')
    dags = tmp_path / "dags"
    dag = entry(tmp_path, "dags", "team")
    assert find_requirements(str(Path(dag).parent), home="/nonexistent") == str(
        tmp_path / "pyproject.toml"
    )
    bounded = find_requirements(str(Path(dag).parent), home="/nonexistent", ceilings=[str(dags)])
    assert bounded is None
    (dags / "requirements.txt").write_text("tabulate\n")
    assert find_requirements(
        str(Path(dag).parent), home="/nonexistent", ceilings=[str(dags)]
    ) == str(dags / "requirements.txt")
