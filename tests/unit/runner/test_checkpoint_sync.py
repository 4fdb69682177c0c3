"""The checkpoint sync engine (``runner/checkpoint.py``) against a ``file://`` store:
only changed files go up, a snapshot is published whole or not at all, deletions
propagate, a restore gives back exactly the last snapshot and refuses a damaged one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.jobs.checkpoint import MANIFEST_NAME, attempt_marker_key
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.runner.checkpoint import CheckpointError, CheckpointSync

PREFIX = "checkpoints/tasks/d/r/t/-1/job/host-0/"


class CountingStore(LocalStore):
    """A LocalStore that records uploads, writes and deletes (and can fail writes)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.uploaded: list[str] = []
        self.written: list[str] = []
        self.deleted: list[str] = []
        self.after_upload: Callable[[], None] | None = None
        self.fail_writes = False

    def upload_files(self, root, relpaths, prefix, progress=None):  # noqa: ANN001, ANN201
        rels = list(relpaths)
        self.uploaded += [f"{prefix}/{r}" for r in rels]
        sent = super().upload_files(root, rels, prefix, progress)
        if self.after_upload is not None:
            self.after_upload()
        return sent

    def write_bytes(self, key, data, **kwargs):  # noqa: ANN001, ANN201
        if self.fail_writes:
            raise OSError("the store went away")
        self.written.append(key)
        return super().write_bytes(key, data, **kwargs)

    def delete(self, key):  # noqa: ANN001, ANN201
        self.deleted.append(key)
        return super().delete(key)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(str(tmp_path / "bucket"))


def attempt(store: CountingStore, tmp_path: Path, n: int) -> CheckpointSync:
    """Attempt ``n``: its marker claimed, its (empty, new) dir restored."""
    store.write_bytes(attempt_marker_key(PREFIX, n), b"{}", if_absent=True)
    sync = CheckpointSync(store, PREFIX, str(tmp_path / f"attempt-{n}"), n)
    sync.restore()
    return sync


def manifest(store: LocalStore) -> dict:
    return json.loads(store.read_bytes(PREFIX + MANIFEST_NAME))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_only_new_and_changed_files_are_uploaded(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    d = Path(s.local_dir)
    for i in range(5):
        write(d / f"shard-{i}.bin", f"weights {i}")
    write(d / "sub" / "step.json", '{"step": 10}')
    assert s.sync() and len(store.uploaded) == 6
    store.uploaded.clear()
    store.written.clear()
    assert s.sync() and store.uploaded == [] and store.written == []  # nothing changed
    write(d / "sub" / "step.json", '{"step": 20}')
    os.utime(d / "shard-0.bin")  # touched: its stat changed, its content did not
    assert s.sync()
    assert [u.rsplit("/", 2)[-2:] for u in store.uploaded] == [["sub", "step.json"]]
    assert store.written == [PREFIX + MANIFEST_NAME]
    assert set(manifest(store)["files"]) == {*(f"shard-{i}.bin" for i in range(5)), "sub/step.json"}
    assert s.stats == {"published": 2, "uploaded_files": 7, "uploaded_bytes": 5 * 9 + 2 * 12}


def test_replaced_objects_are_deleted_once_the_new_manifest_is_written(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    d = Path(s.local_dir)
    write(d / "a", "1")
    write(d / "b", "1")
    s.sync()
    first = manifest(store)["files"]
    write(d / "a", "2")
    (d / "b").unlink()  # a deletion propagates
    s.sync()
    files = manifest(store)["files"]
    assert set(files) == {"a"} and files["a"]["key"] != first["a"]["key"]
    assert sorted(store.list(PREFIX + "files/")) == [PREFIX + files["a"]["key"]]


def test_a_sync_cut_short_publishes_nothing_and_the_next_attempt_restores_the_last(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    d = Path(s.local_dir)
    write(d / "step", "10")
    write(d / "weights", "w10")
    s.sync()
    write(d / "step", "20")
    write(d / "weights", "w20")
    store.fail_writes = True  # the files go up, the manifest does not (a kill, an outage)
    with pytest.raises(OSError):
        s.sync()
    store.fail_writes = False
    again = attempt(store, tmp_path, 2)
    restored = Path(again.local_dir)
    assert (restored / "step").read_text() == "10" and (restored / "weights").read_text() == "w10"
    # What no manifest names (the cut-short upload) was collected by the restore.
    named = {PREFIX + e["key"] for e in manifest(store)["files"].values()}
    assert set(store.list(PREFIX + "files/")) == named


def test_a_file_written_during_its_upload_keeps_its_last_version_until_the_next_sync(
    store, tmp_path
):
    s = attempt(store, tmp_path, 1)
    d = Path(s.local_dir)
    write(d / "log", "v1")
    write(d / "model", "m1")
    s.sync()
    write(d / "log", "v2")
    write(d / "model", "m2")
    store.after_upload = lambda: write(d / "log", "v3, written while v2 went up")
    s.sync()
    store.after_upload = None
    files = manifest(store)["files"]
    old = store.read_bytes(PREFIX + files["log"]["key"])
    assert old == b"v1" and store.read_bytes(PREFIX + files["model"]["key"]) == b"m2"
    s.sync()
    assert store.read_bytes(PREFIX + manifest(store)["files"]["log"]["key"]).startswith(b"v3")


def test_restore_gives_back_the_tree_and_files_in_progress_are_skipped(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    d = Path(s.local_dir)
    write(d / "a" / "b" / "c.txt", "deep")
    write(d / "ckpt.npz.tmp", "half written")
    (d / "link").symlink_to(d / "a" / "b" / "c.txt")
    s.sync()
    assert set(manifest(store)["files"]) == {"a/b/c.txt"}
    again = attempt(store, tmp_path, 2)
    tree = sorted(str(p.relative_to(again.local_dir)) for p in Path(again.local_dir).rglob("*"))
    assert tree == ["a", "a/b", "a/b/c.txt"]
    store.uploaded.clear()
    assert again.sync() and store.uploaded == []  # restored files are known: not re-sent


def test_a_damaged_checkpoint_is_refused_naming_where_it_is(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    write(Path(s.local_dir) / "model", "good")
    s.sync()
    key = PREFIX + manifest(store)["files"]["model"]["key"]
    store.write_bytes(key, b"evil")
    with pytest.raises(CheckpointError, match="does not match its manifest; delete .*host-0"):
        attempt(store, tmp_path, 2)
    store.delete(key)
    with pytest.raises(CheckpointError, match="'model' is missing from the store"):
        attempt(store, tmp_path, 3)


def test_an_older_attempt_still_running_stops_syncing(store, tmp_path):
    old = attempt(store, tmp_path, 1)
    write(Path(old.local_dir) / "step", "5")
    old.sync()
    new = attempt(store, tmp_path, 2)  # its replacement started (the node came back)
    write(Path(new.local_dir) / "step", "6")
    new.sync()
    write(Path(old.local_dir) / "step", "7")
    assert not old.sync() and old.superseded
    assert store.read_bytes(PREFIX + manifest(store)["files"]["step"]["key"]) == b"6"
    assert manifest(store)["attempt"] == 2


def test_an_empty_directory_writes_nothing(store, tmp_path):
    s = attempt(store, tmp_path, 1)
    store.written.clear()
    assert s.sync() and store.written == [] and not store.exists(PREFIX + MANIFEST_NAME)


def test_files_whose_stat_did_not_change_are_not_read(store, tmp_path, monkeypatch):
    from airflow_provider_kinetic.runner import checkpoint as engine

    s = attempt(store, tmp_path, 1)
    for i in range(20):
        write(Path(s.local_dir) / f"f{i}", str(i))
    s.sync()
    read: list[str] = []
    real = engine.digest
    monkeypatch.setattr(engine, "digest", lambda path: read.append(path) or real(path))
    s.sync()
    assert read == []
    write(Path(s.local_dir) / "f3", "changed")
    s.sync()
    assert [os.path.basename(p) for p in read] == ["f3"]
