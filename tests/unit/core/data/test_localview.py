"""How a local job gets its Data (``core/data/localview.py``), for the cases this
machine's test run (root, with a mount namespace) does not take: an unprivileged job
is handed the entry only while nothing in it is writable, and a root job that cannot
get a namespace of its own copies its Data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import localview
from airflow_provider_kinetic.runner import workspace


def entry(tmp_path: Path) -> Path:
    path = tmp_path / "e"
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "a.bin").write_bytes(b"a")
    return path


def test_an_unprivileged_job_gets_the_entry_only_when_all_of_it_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    path = entry(tmp_path)
    assert not localview.needs_copy()  # permission bits bind it
    assert not localview.read_only_tree(str(path))  # directories still writable
    os.chmod(path / "sub" / "a.bin", 0o444)
    os.chmod(path / "sub", 0o555)
    assert not localview.read_only_tree(str(path))  # the top one too
    os.chmod(path, 0o555)
    try:
        assert localview.read_only_tree(str(path))
        assert localview.seal(str(path))  # nothing to mount for it
    finally:
        os.chmod(path, 0o755)
        os.chmod(path / "sub", 0o755)


def test_a_root_job_without_a_namespace_of_its_own_copies_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(localview, "_private", False)  # unshare was refused
    monkeypatch.setattr(localview, "_sealed", set())
    monkeypatch.setenv(workspace.LOCAL_MOUNTS_ENV, "1")
    path = entry(tmp_path)
    assert localview.needs_copy() and not localview.seal(str(path))
    assert not localview.read_only_tree(str(path))
    cached = tmp_path / "default" / "data-cache" / ("0" * 64)  # an entry's name and place
    cached.mkdir(parents=True)
    ref = {"uri": cached.as_uri(), "is_dir": True}
    assert workspace._local_view(ref, str(tmp_path / "t")) is None  # the copy path
