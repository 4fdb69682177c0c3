"""The job context (``core.runtime.context``): which directory, which files, which bytes.

Real files in tmp dirs and the real zip: determinism (same content, same bytes and
hash, whatever the timestamps), kinetic's package-root rules, the default and
user excludes (``.kineticignore``, ``context_excludes``) and the size cap's error.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.runtime.context import (
    PLAN_PATH,
    ContextError,
    ContextTooLargeError,
    build_context,
    find_package_root,
)


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(data: bytes) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return zf.namelist()


def plan(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return json.loads(zf.read(PLAN_PATH))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A DAG project: marker, DAG file, helper data, and things that must stay out."""
    root = tmp_path / "proj"
    write(root / "requirements.txt", "")
    write(root / "dag.py", "# dag\n")
    write(root / "assets" / "labels.txt", "cat\ndog\n")
    write(root / "lib" / "helper.py", "X = 1\n")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "__pycache__" / "dag.cpython-311.pyc", "bytecode")
    write(root / "lib" / "__pycache__" / "helper.cpython-311.pyc", "bytecode")
    write(root / ".venv" / "bin" / "python", "")
    write(root / "node_modules" / "x.js", "")
    write(root / ".DS_Store", "")
    return root


def test_same_content_same_bytes_whatever_the_timestamps(project: Path):
    first = build_context(str(project / "dag.py"))
    for path in project.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    second = build_context(str(project / "dag.py"))
    assert first.data == second.data and first.sha256 == second.sha256
    write(project / "assets" / "labels.txt", "cat\ndog\nbird\n")
    assert build_context(str(project / "dag.py")).sha256 != first.sha256


def test_entries_are_sorted_with_fixed_times_and_modes(project: Path):
    tool = write(project / "bin" / "tool.sh", "#!/bin/sh\n")
    tool.chmod(0o775)
    (project / "empty").mkdir()
    data = build_context(str(project / "dag.py")).data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    files = [i.filename for i in infos[1:]]
    assert infos[0].filename == PLAN_PATH and files == sorted(files)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in infos}
    assert modes["bin/tool.sh"] == 0o755 and modes["dag.py"] == 0o644
    assert "empty/" in files  # empty directories are kept, as kinetic does


def test_default_excludes_and_what_stays(project: Path):
    got = names(build_context(str(project / "dag.py")).data)
    assert set(got) == {
        PLAN_PATH,
        "requirements.txt",
        "dag.py",
        "assets/labels.txt",
        "lib/helper.py",
    }


def test_no_default_excludes_keeps_venv_but_never_git(project: Path, monkeypatch):
    monkeypatch.setenv("KINETIC_NO_DEFAULT_EXCLUDES", "1")
    got = names(build_context(str(project / "dag.py")).data)
    assert ".venv/bin/python" in got and "node_modules/x.js" in got and ".DS_Store" in got
    assert not [n for n in got if n.startswith(".git/") or "__pycache__" in n]


def test_kineticignore_and_context_excludes(project: Path):
    write(project / "data" / "big.bin", "b" * 10)
    write(project / "notes.tmp", "scratch")
    write(project / "assets" / "raw" / "frame.png", "png")
    write(project / "logs" / "run.log", "log")
    write(project / "keep.log", "a file named like the dir-only pattern's dir")
    write(
        project / ".kineticignore",
        "# comment\n\n/data/\nassets/raw/\nlogs/\n",
    )
    got = set(names(build_context(str(project / "dag.py"), excludes=["*.tmp"]).data))
    assert {"notes.tmp", "data/big.bin", "assets/raw/frame.png", "logs/run.log"} & got == set()
    assert {"keep.log", ".kineticignore", "assets/labels.txt"} <= got
    # Without the operator's patterns, *.tmp is archived again.
    assert "notes.tmp" in names(build_context(str(project / "dag.py")).data)


def test_data_inside_the_project_is_left_to_the_data_cache(project: Path):
    got = names(build_context(str(project / "dag.py"), skip=[str(project / "assets")]).data)
    assert "assets/labels.txt" not in got and "lib/helper.py" in got


@pytest.mark.parametrize("bad", [{"*.tmp": 1}, b"*.tmp", [""], [3], None])
def test_bad_patterns_are_clear_errors(project: Path, bad):
    if bad is None:  # None means "no extra patterns"
        assert build_context(str(project / "dag.py"), excludes=bad).files == 4
        return
    with pytest.raises(ContextError, match="glob"):
        build_context(str(project / "dag.py"), excludes=bad)


def test_plan_puts_the_root_on_sys_path_and_runs_there(project: Path):
    write(project / "dags" / "nested.py")
    p = plan(build_context(str(project / "dags" / "nested.py")).data)
    assert p["package_root"] == str(project.resolve())
    assert p["entry_rel"] == "dags" and p["client_cwd_rel"] == "."
    assert p["sys_path_rel"] == ["", "dags"]


# ---- the package root -------------------------------------------------------------------


def test_root_is_the_nearest_marker_above_the_dag(tmp_path: Path):
    write(tmp_path / "repo" / "pyproject.toml")
    write(tmp_path / "repo" / "dags" / "team" / "dag.py")
    assert find_package_root(str(tmp_path / "repo" / "dags" / "team"), home=str(tmp_path)) == str(
        (tmp_path / "repo").resolve()
    )


def test_package_dirs_are_climbed_first(tmp_path: Path):
    write(tmp_path / "proj" / ".git" / "HEAD")
    write(tmp_path / "proj" / "pkg" / "__init__.py")
    write(tmp_path / "proj" / "pkg" / "sub" / "__init__.py")
    root = find_package_root(str(tmp_path / "proj" / "pkg" / "sub"), home=str(tmp_path))
    assert root == str((tmp_path / "proj").resolve())


def test_without_a_marker_the_dag_dir_is_kept_and_home_never_adopted(tmp_path: Path):
    write(tmp_path / "requirements.txt")  # tmp_path plays $HOME: never adopted from below
    write(tmp_path / "dags" / "dag.py")
    assert find_package_root(str(tmp_path / "dags"), home=str(tmp_path)) == str(
        (tmp_path / "dags").resolve()
    )
    # ... unless the walk starts there.
    assert find_package_root(str(tmp_path), home=str(tmp_path)) == str(tmp_path.resolve())


def test_package_root_override(tmp_path: Path, monkeypatch):
    write(tmp_path / "a" / "b" / "dag.py")
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(tmp_path / "a"))
    assert find_package_root(str(tmp_path / "a" / "b")) == str((tmp_path / "a").resolve())
    monkeypatch.setenv("KINETIC_PACKAGE_ROOT", str(tmp_path / "elsewhere"))
    with pytest.raises(ContextError, match="KINETIC_PACKAGE_ROOT"):
        find_package_root(str(tmp_path / "a" / "b"))


# ---- the size cap ----------------------------------------------------------------------


def test_over_the_cap_names_the_largest_files_and_the_way_out(project: Path):
    write(project / "data" / "huge.csv", "x" * 700_000)
    write(project / "model.bin", "y" * 400_000)
    with pytest.raises(ContextTooLargeError) as err:
        build_context(str(project / "dag.py"), max_mb=1)
    text = str(err.value)
    assert text.index("data/huge.csv") < text.index("model.bin")
    assert ".kineticignore" in text and "context_excludes" in text
    assert "max_context_mb" in text and "'data/'" in text
    # Excluding the biggest file brings it under the cap; 0 disables the cap.
    assert build_context(str(project / "dag.py"), max_mb=1, excludes=["data/"]).files == 5
    assert build_context(str(project / "dag.py"), max_mb=0).files == 6


def test_missing_entry_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ContextError, match="does not exist"):
        build_context(str(tmp_path / "nope.py"))


def test_operator_rejects_bad_context_excludes_when_the_dag_is_parsed():
    from airflow_provider_kinetic import KineticRunOperator

    with pytest.raises(ContextError, match="context_excludes must be a list of glob patterns"):
        KineticRunOperator(task_id="t", python_callable=len, context_excludes={"*.tmp": 1})
    op = KineticRunOperator(task_id="t2", python_callable=len, context_excludes=["*.tmp"])
    assert op.context_excludes == ["*.tmp"]
    # One pattern is a list of one (never its characters).
    one = KineticRunOperator(task_id="t3", python_callable=len, context_excludes="*.tmp")
    assert one.context_excludes == ["*.tmp"]


def test_the_dags_folder_is_a_ceiling(tmp_path: Path):
    """A marker above the DAGs folder ($AIRFLOW_HOME/requirements.txt) is not adopted:
    the context never holds the Airflow home and its logs."""
    write(tmp_path / "airflow" / "requirements.txt")
    write(tmp_path / "airflow" / "logs" / "big.log", "log")
    write(tmp_path / "airflow" / "dags" / "team" / "dag.py")
    dags, team = tmp_path / "airflow" / "dags", tmp_path / "airflow" / "dags" / "team"
    assert find_package_root(str(team), home=str(tmp_path)) == str((tmp_path / "airflow").resolve())
    assert find_package_root(str(team), home=str(tmp_path), ceilings=[str(dags)]) == str(
        team.resolve()
    )
    write(dags / ".git")  # the DAGs folder itself may be the root
    assert find_package_root(str(team), home=str(tmp_path), ceilings=[str(dags)]) == str(
        dags.resolve()
    )
    # A ceiling that does not hold the DAG changes nothing.
    other = str(tmp_path / "elsewhere")
    assert find_package_root(str(team), home=str(tmp_path), ceilings=[other]) == str(dags.resolve())
