"""A single file through a FUSE mount resolves to that file, never to a sibling."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kinetic.runner.workspace import resolve_refs


def _ref(uri: str, mount: Path, is_dir: bool = False) -> dict:
    return {"__data_ref__": True, "uri": uri, "is_dir": is_dir, "fuse": True,
            "mount_path": str(mount)}  # fmt: skip


def _resolve(ref: dict) -> str:
    return resolve_refs({"x": ref}, "/nonexistent-workdir", {})["x"]


def test_a_gcs_file_mounted_through_its_prefix_is_that_file_not_the_first_sibling(tmp_path):
    for name in ("a_first.txt", "file.txt", "z_last.txt"):  # the prefix's siblings
        (tmp_path / name).write_text(name)
    assert _resolve(_ref("gs://b/p/file.txt", tmp_path)) == str(tmp_path / "file.txt")


def test_a_cache_entry_holding_one_file_is_that_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    ref = _ref("gs://bucket/kinetic/data-cache/" + "ab" * 32, tmp_path)
    assert _resolve(ref) == str(tmp_path / "config.json")


def test_a_missing_file_among_others_is_refused_naming_it(tmp_path):
    (tmp_path / "other1").write_text("1")
    (tmp_path / "other2").write_text("2")
    with pytest.raises(FileNotFoundError, match=r"gs://b/p/file.txt.*2 other entries"):
        _resolve(_ref("gs://b/p/file.txt", tmp_path))


def test_a_directory_is_its_mount(tmp_path):
    (tmp_path / "f").write_text("f")
    assert _resolve(_ref("gs://b/p/", tmp_path, is_dir=True)) == str(tmp_path)
