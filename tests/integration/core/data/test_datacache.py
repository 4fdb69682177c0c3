"""kinetic's data cache (its per-tree layout) on both stores: a marker means
"complete", it is written last, a hit uploads nothing, and an interrupted upload is
redone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.cache import DataChangedDuringUpload
from airflow_provider_kinetic.core.data.refs import make_data_ref
from airflow_provider_kinetic.core.data.schemes.download import (
    DataHashMismatch,
    download_from_store,
)
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore


@pytest.fixture
def store(store: ObjectStore) -> ObjectStore:
    """kinetic 0.0.4's per-tree layout (``data_layout="kinetic"``), which this module
    pins down; the incremental layout: test_data_incremental.py."""
    store.data_layout = "kinetic"
    return store


def snapshot(store: ObjectStore) -> dict[str, Any]:
    """Every object with a version stamp that changes when it is rewritten."""
    if isinstance(store, LocalStore):
        out = {}
        for key in store.list(""):
            st = os.stat(os.path.join(store.bucket, key))
            out[key] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return out
    return {b.name: (b.generation, b.size) for b in store.client.list_blobs(store.bucket)}


class Recorder:
    """Wraps a store and records the calls ``upload_data`` makes, in order."""

    def __init__(self, inner: ObjectStore, fail_after: int | None = None):
        self.inner = inner
        self.events: list[tuple] = []
        self.fail_after = fail_after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def exists(self, key: str) -> bool:
        self.events.append(("exists", key))
        return self.inner.exists(key)

    def upload_files(self, root, relpaths, prefix, progress=None, **kw: Any) -> int:
        rels = list(relpaths)
        self.events.append(("upload_files:start", prefix, tuple(rels)))
        if self.fail_after is not None:
            self.inner.upload_files(root, rels[: self.fail_after], prefix, **kw)
            raise ConnectionError("network dropped mid-upload")
        n = self.inner.upload_files(root, rels, prefix, progress=progress, **kw)
        self.events.append(("upload_files:end", prefix))
        return n

    def write_bytes(self, key: str, data: bytes, **kw: Any) -> None:
        # What is in the cache at the moment the marker is written.
        content = self.inner.list(datacache.CACHE_PREFIX + "/")
        self.events.append(("write_bytes", key, tuple(content)))
        self.inner.write_bytes(key, data, **kw)

    def upload_file(self, local_path: str, key: str) -> int:
        self.events.append(("upload_file", key))
        return self.inner.upload_file(local_path, key)


def make_tree(root: Path, n: int = 25) -> list[str]:
    rels = [f"part{i % 3}/file-{i:03d}.txt" for i in range(n)] + ["top.txt", "日本/ñ.bin"]
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode() * 3)
    return sorted(rels)


def test_layout_matches_kinetic(store: ObjectStore, tmp_path: Path) -> None:
    rels = make_tree(tmp_path / "tree")
    d = Data(str(tmp_path / "tree"))
    assert datacache.upload_data(store, d) is True
    h = d.content_hash()
    assert store.list(f"default/data-cache/{h}/") == [f"default/data-cache/{h}/{r}" for r in rels]
    assert store.exists(f"default/data-markers/{h}")
    assert store.read_bytes(f"default/data-markers/{h}") == b""
    single = tmp_path / "model.bin"
    single.write_bytes(b"weights")
    s = Data(str(single))
    assert datacache.upload_data(store, s) is True
    sh = s.content_hash()
    assert store.list(f"default/data-cache/{sh}/") == [f"default/data-cache/{sh}/model.bin"]


def test_second_upload_is_a_hit_and_writes_nothing(store: ObjectStore, tmp_path: Path) -> None:
    make_tree(tmp_path / "tree")
    assert datacache.upload_data(store, Data(str(tmp_path / "tree"))) is True
    before = snapshot(store)
    assert len(before) == 28  # 27 files + marker
    rec = Recorder(store)
    # A fresh Data on an identical copy elsewhere: same hash, so still a hit.
    make_tree(tmp_path / "copy")
    assert datacache.upload_data(rec, Data(str(tmp_path / "copy"))) is False
    assert [e[0] for e in rec.events] == ["exists"]  # checked the marker, wrote nothing
    assert snapshot(store) == before


def test_marker_is_written_after_all_content(store: ObjectStore, tmp_path: Path) -> None:
    rels = make_tree(tmp_path / "tree", n=60)
    d = Data(str(tmp_path / "tree"))
    rec = Recorder(store)
    assert datacache.upload_data(rec, d) is True
    h = d.content_hash()
    kinds = [e[0] for e in rec.events]
    assert kinds == ["exists", "upload_files:start", "upload_files:end", "write_bytes"]
    _, marker, content_then = rec.events[-1]
    assert marker == datacache.marker_key(h)
    assert content_then == tuple(f"{datacache.cache_key(h)}/{r}" for r in rels)


def test_interrupted_upload_leaves_no_marker_and_is_redone(
    store: ObjectStore, tmp_path: Path
) -> None:
    rels = make_tree(tmp_path / "tree")
    d = Data(str(tmp_path / "tree"))
    h = d.content_hash()
    broken = Recorder(store, fail_after=5)
    with pytest.raises(ConnectionError):
        datacache.upload_data(broken, d)
    assert not store.exists(datacache.marker_key(h))
    assert not any(e[0] == "write_bytes" for e in broken.events)
    assert len(store.list(datacache.cache_key(h) + "/")) == 5  # partial content, no marker
    rec = Recorder(store)
    assert datacache.upload_data(rec, Data(str(tmp_path / "tree"))) is True
    assert [e[0] for e in rec.events][-1] == "write_bytes"
    assert store.exists(datacache.marker_key(h))
    assert store.list(datacache.cache_key(h) + "/") == [
        f"{datacache.cache_key(h)}/{r}" for r in rels
    ]


def test_upload_all_dedups_identical_content(store: ObjectStore, tmp_path: Path) -> None:
    make_tree(tmp_path / "a", n=5)
    make_tree(tmp_path / "b", n=5)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "other.txt").write_text("different")
    items = [Data(str(tmp_path / n)) for n in "abc"] + [Data(str(tmp_path / "a"))]
    result = datacache.upload_all(store, items)
    assert result == {items[0].content_hash(): True, items[2].content_hash(): True}
    assert len(store.list(datacache.MARKER_PREFIX + "/")) == 2
    assert datacache.upload_all(store, items) == dict.fromkeys(result, False)
    assert datacache.upload_all(store, []) == {}


def test_local_cache_entries_are_read_only(tmp_path):
    """FUSE data on the local backend is served from the cache dir: it must be read-only."""
    import stat

    from airflow_provider_kinetic.core.data import Data
    from airflow_provider_kinetic.core.data.cache import cache_key, upload_data
    from airflow_provider_kinetic.core.storage import LocalStore

    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "a.txt").write_text("a")
    store = LocalStore(str(tmp_path / "store"))
    data = Data(str(tmp_path / "src"))
    assert upload_data(store, data) is True
    entry = tmp_path / "store" / cache_key(data.content_hash()) / "sub" / "a.txt"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o444


def test_special_file_fails_before_anything_is_uploaded(store: ObjectStore, tmp_path: Path):
    from airflow_provider_kinetic.core.data import DataPathError

    make_tree(tmp_path / "tree", n=5)
    os.mkfifo(tmp_path / "tree" / "part0" / "fifo")
    rec = Recorder(store)
    with pytest.raises(DataPathError, match="fifo"):
        datacache.upload_data(rec, Data(str(tmp_path / "tree")))
    assert rec.events == []  # not even the marker lookup
    assert store.list("") == []


def test_upload_sends_exactly_what_was_hashed(store: ObjectStore, tmp_path: Path) -> None:
    """A file added after hashing is not uploaded under a hash that does not cover it."""
    rels = make_tree(tmp_path / "tree", n=5)
    d = Data(str(tmp_path / "tree"))
    h = d.content_hash()
    (tmp_path / "tree" / "late.txt").write_bytes(b"late")
    assert datacache.upload_data(store, d) is True
    assert store.list(datacache.cache_key(h) + "/") == [
        f"{datacache.cache_key(h)}/{r}" for r in rels
    ]


def reader(store: ObjectStore) -> ObjectStore | None:
    """The store a job reads a ref's URI with (a file:// URI names its own root)."""
    return None if isinstance(store, LocalStore) else store


class ChangedBeforeUpload(Recorder):
    """A store whose ``upload_files`` first rewrites ``path`` (as a writer would,
    between ``upload_data``'s hashing and its upload): no timing race, the change
    lands at exactly that point."""

    def __init__(self, inner: ObjectStore, path: Path, content: bytes):
        super().__init__(inner)
        self.path, self.content = path, content

    def upload_files(self, root, relpaths, prefix, progress=None, **kw: Any) -> int:
        self.path.write_bytes(self.content)
        return super().upload_files(root, relpaths, prefix, progress, **kw)


@pytest.mark.parametrize("lone", [False, True], ids=["dir", "file"])
def test_a_file_changed_between_hash_and_upload_leaves_no_entry_marker(
    store: ObjectStore, tmp_path: Path, lone: bool
) -> None:
    """The upload hashes the bytes it sends: ones that are not the entry's name fail
    the upload naming the file, and no marker is written, so the next run with the
    data stable uploads the entry again instead of hitting a poisoned one."""
    rels = make_tree(tmp_path / "tree", n=5)
    changed = tmp_path / "tree" / (rels[0] if not lone else "top.txt")
    good = changed.read_bytes()
    d = Data(str(changed if lone else tmp_path / "tree"))
    h = d.content_hash()
    rec = ChangedBeforeUpload(store, changed, b"half-written")
    with pytest.raises(DataChangedDuringUpload, match=rf"{'top.txt' if lone else rels[0]}"):
        datacache.upload_data(rec, d)
    assert not store.exists(datacache.marker_key(h))
    assert not [e for e in rec.events if e[0] == "write_bytes"]
    changed.write_bytes(good)  # the writer finished: the data is what was hashed
    again = Data(str(changed if lone else tmp_path / "tree"))
    assert again.content_hash() == h and datacache.upload_data(store, again) is True
    assert store.exists(datacache.marker_key(h))
    ref = make_data_ref(store.uri(datacache.cache_key(h)), again.is_dir)
    out = download_from_store(ref, str(tmp_path / "out"), reader(store))
    path = Path(out) if lone else Path(out) / rels[0]
    assert path.read_bytes() == good


def test_an_entry_found_bad_when_read_loses_its_marker_and_is_uploaded_again(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that reads an entry whose bytes are not its name fails (DataHashMismatch)
    and removes the entry's marker with a warning naming it: the next submit of the
    same data uploads it again instead of every run failing on it."""
    rels = make_tree(tmp_path / "tree", n=5)
    d = Data(str(tmp_path / "tree"))
    h = d.content_hash()
    assert datacache.upload_data(store, d) is True
    key = f"{datacache.cache_key(h)}/{rels[1]}"
    store.write_bytes(key, b"not what was hashed")
    ref = make_data_ref(store.uri(datacache.cache_key(h)), True)
    with pytest.raises(DataHashMismatch, match="marker was removed"):
        download_from_store(ref, str(tmp_path / "out"), reader(store))
    assert not store.exists(datacache.marker_key(h))
    warned = [r.message for r in caplog.records if r.levelname == "WARNING" and h in r.message]
    assert warned and "uploads it again" in warned[0]
    assert datacache.upload_data(store, Data(str(tmp_path / "tree"))) is True
    out = download_from_store(ref, str(tmp_path / "out"), reader(store))
    assert (Path(out) / rels[1]).read_bytes() == (tmp_path / "tree" / rels[1]).read_bytes()


class StepClock:
    """``core.data.cache``'s clock: each reading moves it on ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize(("step", "lines"), [(0.0, 0), (datacache.PROGRESS_AFTER_S, 3)])
def test_upload_progress_lines_only_for_an_upload_long_enough_to_need_them(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    step: float,
    lines: int,
) -> None:
    """A quick upload says what it uploads and no progress; one still running after
    ``PROGRESS_AFTER_S`` (a clock that moves that much a reading) shows its lines from
    then on, to the last file."""
    monkeypatch.setattr(datacache, "_clock", StepClock(step))
    for i in range(3):
        (tmp_path / "tree").mkdir(exist_ok=True)
        (tmp_path / "tree" / f"f{i}.bin").write_bytes(b"x" * 1024)
    caplog.set_level("INFO", logger=datacache.log.name)
    # kinetic's per-tree upload reports progress per file (the incremental one, the
    # default, says only what it sent, at the end).
    store, tree = LocalStore(str(tmp_path / "bucket")), Data(str(tmp_path / "tree"))
    assert datacache.upload_data(store, tree, layout="kinetic")
    said = [r.getMessage() for r in caplog.records if r.name == datacache.log.name]
    progress = [m for m in said if m.startswith("  ") and "files," in m]
    assert any(m.startswith("uploading ") for m in said)
    assert len(progress) == lines, said
    if lines:
        assert progress[-1].endswith("3/3 files, 3.0 KiB")
