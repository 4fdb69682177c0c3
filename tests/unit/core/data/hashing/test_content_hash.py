"""Our ``Data.content_hash()`` must equal keras-kinetic 0.0.4's on the same tree, so a
kinetic user's data cache (``default/data-cache/{hash}``) is shared with our jobs.

The reference is the real ``keras-kinetic==0.0.4`` wheel.  ``import kinetic`` needs
``google-cloud-artifactregistry`` (pulled in by ``kinetic/__init__``), which the test
environment does not install, so when the package import fails we load the wheel's own
``kinetic/data/data.py`` as a standalone module (it needs only ``absl``).  Without the
wheel installed at all, it is unpacked from uv's cache (offline); otherwise the
comparisons are skipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import (
    Data,
    DataPathError,
    DataReadError,
    content_hash_of,
    iter_tree,
)
from airflow_provider_kinetic.core.data.hashing import treehash, treewalk

KINETIC_PIN = "keras-kinetic==0.0.4"


def _exec_standalone(package_dir: str) -> types.ModuleType:
    path = os.path.join(package_dir, "data", "data.py")
    mod_spec = importlib.util.spec_from_file_location("_kinetic_0_0_4_data", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _wheel_from_uv_cache(target: Path) -> str | None:
    """The pinned wheel unpacked into ``target`` from uv's cache (no network)."""
    cmd = ["uv", "pip", "install", "--offline", "--no-deps", "--python", sys.executable,
           "--target", str(target), KINETIC_PIN]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    package = target / "kinetic"
    return str(package) if done.returncode == 0 and package.is_dir() else None


@pytest.fixture(scope="module")
def kinetic_data(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    try:  # importing the subpackage runs kinetic/__init__ (``import kinetic``) first
        from kinetic.data import data as kdata

        return kdata
    except ImportError:
        pass
    spec = importlib.util.find_spec("kinetic")  # locates the package without running it
    if spec is not None and spec.submodule_search_locations:
        return _exec_standalone(list(spec.submodule_search_locations)[0])
    package = _wheel_from_uv_cache(tmp_path_factory.mktemp("kinetic-wheel"))
    if package is None:
        pytest.skip(f"{KINETIC_PIN} is not installed (pip install --no-deps {KINETIC_PIN})")
    return _exec_standalone(package)


def write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def assert_same(kinetic_data: types.ModuleType, path: Path) -> str:
    ours = Data(str(path)).content_hash()
    theirs = kinetic_data.Data(str(path)).content_hash()
    assert ours == theirs, f"hash differs from kinetic 0.0.4 for {path}"
    assert len(ours) == 64 and int(ours, 16) >= 0
    return ours


def test_nested_tree_with_empty_dirs(kinetic_data, tmp_path: Path) -> None:
    root = write(
        tmp_path / "t",
        {
            "b.txt": b"bbb",
            "a.txt": b"a",
            "z/1.bin": os.urandom(300_000),  # more than one 256 KiB read chunk
            "z/y/deep.txt": b"deep",
            "sub/x.txt": b"x",
            "sub/a/first.txt": b"first",
            "empty.txt": b"",
        },
    )
    (root / "empty-dir").mkdir()
    (root / "sub" / "also-empty" / "nested").mkdir(parents=True)
    h = assert_same(kinetic_data, root)
    # Empty directories do not take part in the hash.
    (root / "empty-dir").rmdir()
    assert Data(str(root)).content_hash() == h


def test_walk_order_files_before_subdirs(kinetic_data, tmp_path: Path) -> None:
    """'a/z.txt' vs 'a.txt' vs 'a/b/c': pre-order DFS, not a global path sort."""
    root = write(
        tmp_path / "t",
        {"a/z.txt": b"1", "a/b/c.txt": b"2", "a.txt": b"3", "a-b.txt": b"4", "A.txt": b"5"},
    )
    assert_same(kinetic_data, root)


def test_symlinked_file_is_followed(kinetic_data, tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    target.write_bytes(b"target content")
    root = write(tmp_path / "t", {"real.txt": b"real"})
    os.symlink(target, root / "link.txt")
    h = assert_same(kinetic_data, root)
    # The link's content (the target's) is hashed, under the link's name.
    copy = write(tmp_path / "copy", {"real.txt": b"real", "link.txt": b"target content"})
    assert Data(str(copy)).content_hash() == h
    # A Data naming the link itself: a single file named after the link.
    as_file = assert_same(kinetic_data, root / "link.txt")
    assert as_file == Data(str(copy / "link.txt")).content_hash()


def test_relative_path_is_made_absolute(kinetic_data, tmp_path: Path, monkeypatch) -> None:
    write(tmp_path / "rel", {"a.txt": b"a"})
    monkeypatch.chdir(tmp_path)
    assert Data("rel").content_hash() == kinetic_data.Data("rel").content_hash()
    assert Data("rel").content_hash() == Data(str(tmp_path / "rel")).content_hash()


def test_symlinked_dir_inside_a_tree_is_refused(kinetic_data, tmp_path: Path) -> None:
    """kinetic 0.0.4 does not descend into a directory symlink (its hash is the tree's
    without it): following it would change the shared hash, skipping it would drop
    data without a word, so it is refused, naming the Data path, the entry and the
    rule.  The Data path itself may be a link to a directory (followed, as kinetic)."""
    other = write(tmp_path / "other", {"inner.txt": b"inner"})
    root = write(tmp_path / "t", {"x.txt": b"x", "sub/y.txt": b"y"})
    os.symlink(other, root / "sub" / "linked-dir")
    plain = Data(str(write(tmp_path / "plain", {"x.txt": b"x", "sub/y.txt": b"y"})))
    assert kinetic_data.Data(str(root)).content_hash() == plain.content_hash()
    for stat_cache in (None, tmp_path / "statcache"):
        with pytest.raises(DataPathError) as info:
            content_hash_of(str(root), stat_cache=stat_cache)
        msg = str(info.value)
        assert repr(str(root)) in msg and repr(str(root / "sub" / "linked-dir")) in msg
        assert "symlink to a directory" in msg and "must point to a regular file" in msg
    with pytest.raises(DataPathError, match="linked-dir"):
        list(iter_tree(str(root)))  # the upload's walk refuses it as well
    os.symlink(tmp_path / "plain", tmp_path / "root-link")
    assert assert_same(kinetic_data, tmp_path / "root-link") == plain.content_hash()


@pytest.mark.parametrize("kind", ["missing", "loop", "through-a-file"])
def test_dangling_symlink_inside_a_tree_is_refused(kinetic_data, tmp_path: Path, kind) -> None:
    """A link that leads nowhere is refused (kinetic cannot read it either), naming it."""
    root = write(tmp_path / "t", {"x.txt": b"x"})
    (root / "deep").mkdir()
    link = root / "deep" / "stale.txt"
    target = {
        "missing": tmp_path / "gone.txt",
        "loop": link,
        "through-a-file": root / "x.txt" / "below",
    }[kind]
    os.symlink(target, link)
    with pytest.raises(OSError):
        kinetic_data.Data(str(root)).content_hash()
    for stat_cache in (None, tmp_path / "statcache"):
        with pytest.raises(DataPathError) as info:
            content_hash_of(str(root), stat_cache=stat_cache)
        msg = str(info.value)
        assert repr(str(root)) in msg and repr(str(link)) in msg
        assert "dangling symlink" in msg and "must point to a regular file" in msg


def test_empty_dirs_are_listed_and_leave_the_hash_alone(kinetic_data, tmp_path: Path) -> None:
    """Empty directories are not in kinetic's hash; ``Data.empty_dirs`` lists the ones
    a download of the files would not recreate (leaves only), in walk order."""
    root = write(tmp_path / "t", {"a.txt": b"a", "sub/x.txt": b"x", "z/keep.txt": b"k"})
    (root / "empty-dir").mkdir()
    (root / "sub" / "also-empty" / "nested").mkdir(parents=True)
    (root / "z" / "hollow").mkdir()
    data = Data(str(root))
    assert data.content_hash() == kinetic_data.Data(str(root)).content_hash()
    expected = ["empty-dir", "sub/also-empty/nested", "z/hollow"]
    assert data.empty_dirs() == expected
    kept_hash_only = pickle.loads(pickle.dumps(data))  # walks again for the list
    assert kept_hash_only.empty_dirs() == expected
    assert Data(str(root / "a.txt")).empty_dirs() == []
    void = tmp_path / "void"
    void.mkdir()
    assert Data(str(void)).empty_dirs() == []  # the root itself is always made
    assert assert_same(kinetic_data, void) == hashlib.sha256(b"dir:").hexdigest()


def test_single_file(kinetic_data, tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(1000))
    assert_same(kinetic_data, path)


def test_unicode_names(kinetic_data, tmp_path: Path) -> None:
    root = write(
        tmp_path / "t",
        {"données/ñ.txt": "ñ".encode(), "日本.bin": b"\x00\x01", "ß/é é.txt": b"space"},
    )
    assert_same(kinetic_data, root)
    assert_same(kinetic_data, root / "日本.bin")


def test_big_files_hash_on_a_pool_small_ones_inline(
    kinetic_data, tmp_path: Path, monkeypatch
) -> None:
    files = {
        f"d{i % 7}/s{i % 3}/f{i:04d}.txt": f"content {i}".encode() * (i % 50) for i in range(600)
    }
    files["huge.bin"] = os.urandom(3 << 20)  # streamed through the read buffer
    root = write(tmp_path / "t", files)
    pools = []

    class Spy(treehash.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(treehash, "ThreadPoolExecutor", Spy)
    h = assert_same(kinetic_data, root)
    assert len(pools) == 1, "a file of 256 KiB or more goes to the pool"
    pools.clear()
    (root / "huge.bin").unlink()
    assert_same(kinetic_data, root)
    assert pools == [], "small files hash inline (threads cost more than they save)"
    monkeypatch.setattr(treehash, "THREAD_FILE", 1)  # everything on the pool
    (root / "huge.bin").write_bytes(files["huge.bin"])
    assert content_hash_of(str(root), stat_cache=None) == h
    assert len(pools) == 1


def test_cache_off_and_on_agree(kinetic_data, tmp_path: Path) -> None:
    root = write(tmp_path / "t", {f"f{i}": bytes([i]) * i for i in range(40)})
    cache = str(tmp_path / "cache")
    expected = kinetic_data.Data(str(root)).content_hash()
    assert content_hash_of(str(root), stat_cache=None) == expected
    assert content_hash_of(str(root), stat_cache=cache) == expected
    assert content_hash_of(str(root), stat_cache=cache) == expected


def test_threshold_boundary(kinetic_data, tmp_path: Path) -> None:
    for n in (16, 17):
        root = write(tmp_path / f"n{n}", {f"f{i:02d}": bytes([i]) for i in range(n)})
        assert_same(kinetic_data, root)


def test_empty_directory(kinetic_data, tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    h = assert_same(kinetic_data, root)
    assert h == hashlib.sha256(b"dir:").hexdigest()


def test_file_and_dir_holding_only_it_differ(kinetic_data, tmp_path: Path) -> None:
    root = write(tmp_path / "d", {"only.txt": b"same"})
    as_dir = assert_same(kinetic_data, root)
    as_file = assert_same(kinetic_data, root / "only.txt")
    assert as_dir != as_file


def test_rename_changes_hash(tmp_path: Path) -> None:
    a = Data(str(write(tmp_path / "a", {"x.txt": b"1"}))).content_hash()
    b = Data(str(write(tmp_path / "b", {"y.txt": b"1"}))).content_hash()
    assert a != b


def test_hash_is_cached_per_instance(tmp_path: Path) -> None:
    root = write(tmp_path / "t", {"a.txt": b"before"})
    d = Data(str(root))
    first = d.content_hash()
    (root / "a.txt").write_bytes(b"after")
    (root / "new.txt").write_bytes(b"new")
    assert d.content_hash() == first  # snapshot semantics
    fresh = Data(str(root)).content_hash()
    assert fresh != first  # a new instance sees the change


def test_pickling_keeps_the_hash(tmp_path: Path) -> None:
    root = write(tmp_path / "t", {"a.txt": b"before"})
    d = Data(str(root))
    first = d.content_hash()
    (root / "a.txt").write_bytes(b"after")
    clone = pickle.loads(pickle.dumps(d))
    assert clone == d
    assert clone.content_hash() == first
    # The lock is rebuilt, so the clone still hashes fresh instances correctly.
    assert clone._lock is not d._lock
    assert pickle.loads(pickle.dumps(Data(str(root)))).content_hash() != first


def test_gcs_data_has_no_content_hash() -> None:
    with pytest.raises(ValueError, match="gs://bucket/x"):
        Data("gs://bucket/x/").content_hash()


# -- things that are not files or directories (issue 9) ------------------------------


@pytest.mark.timeout(30)
def test_fifo_inside_the_tree_is_an_error_not_a_hang(tmp_path: Path) -> None:
    root = write(tmp_path / "t", {"a.txt": b"a", "sub/b.txt": b"b"})
    os.mkfifo(root / "sub" / "pipe")
    with pytest.raises(DataPathError) as exc:
        Data(str(root)).content_hash()
    message = str(exc.value)
    assert repr(str(root)) in message and "pipe" in message and "FIFO" in message


@pytest.mark.timeout(30)
def test_fifo_as_the_data_path(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataPathError, match=r"Data path .*pipe' is a FIFO"):
        Data(str(tmp_path / "pipe")).content_hash()
    os.symlink(tmp_path / "pipe", tmp_path / "link")
    with pytest.raises(DataPathError, match="is a FIFO"):
        Data(str(tmp_path / "link")).content_hash()


@pytest.mark.timeout(30)
def test_fifo_found_by_a_cached_walk(tmp_path: Path) -> None:
    root = write(tmp_path / "t", {"a.txt": b"a"})
    cache = str(tmp_path / "cache")
    content_hash_of(str(root), stat_cache=cache)
    os.mkfifo(root / "late-pipe")
    with pytest.raises(DataPathError, match="late-pipe"):
        content_hash_of(str(root), stat_cache=cache)


def test_socket_and_device_are_errors(tmp_path: Path) -> None:
    import socket

    root = write(tmp_path / "t", {"a.txt": b"a"})
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
        with pytest.raises(DataPathError, match="sock.*a socket"):
            Data(str(root)).content_hash()
    finally:
        sock.close()
    os.unlink(root / "sock")
    os.symlink("/dev/null", root / "null")  # a link to a device counts as the device
    with pytest.raises(DataPathError, match="null.*character device"):
        Data(str(root)).content_hash()


@pytest.mark.timeout(30)
def test_fifo_swapped_in_after_the_walk_does_not_hang(tmp_path: Path, monkeypatch) -> None:
    root = write(tmp_path / "t", {"a.txt": b"aaaa"})
    real = treewalk.stat_dir

    def swap(fd, path, rel, *args):  # type: ignore[no-untyped-def]
        out = real(fd, path, rel, *args)
        os.unlink(root / "a.txt")
        os.mkfifo(root / "a.txt")
        return out

    cache = str(tmp_path / "cache")
    content_hash_of(str(root), stat_cache=cache)  # a record, so the next walk stats first
    (root / "a.txt").write_bytes(b"bbbb")
    monkeypatch.setattr(treehash, "stat_dir", swap)
    with pytest.raises(DataPathError, match="a.txt.*FIFO"):
        content_hash_of(str(root), stat_cache=cache)


def test_unreadable_file_names_its_data_path(tmp_path: Path, monkeypatch) -> None:
    root = write(tmp_path / "t", {"ok.txt": b"ok", "secret/key.txt": b"k"})
    real_open = os.open

    def deny(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).endswith("key.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(DataReadError) as exc:
        Data(str(root)).content_hash()
    assert isinstance(exc.value, OSError) and exc.value.errno == 13
    assert repr(str(root)) in str(exc.value) and "key.txt" in str(exc.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_for_real(tmp_path: Path) -> None:
    root = write(tmp_path / "t", {"ok.txt": b"ok", "key.txt": b"k"})
    (root / "key.txt").chmod(0)
    try:
        with pytest.raises(DataReadError, match="key.txt"):
            Data(str(root)).content_hash()
    finally:
        (root / "key.txt").chmod(0o644)


def test_large_files_are_read_ahead_by_a_second_thread(kinetic_data, tmp_path, monkeypatch):
    """Files of PIPELINE_MIN or more are read by a second thread while the first hashes:
    same digest as kinetic's, through the pipelined path (where there is a second core)."""
    from airflow_provider_kinetic.core.data.hashing import filedigest

    monkeypatch.setattr(filedigest, "PIPELINE_MIN", 3 << 20)
    monkeypatch.setattr(filedigest, "_CORES", 2)
    used = []
    real = filedigest._read_pipelined
    monkeypatch.setattr(filedigest, "_read_pipelined", lambda fd, h: used.append(fd) or real(fd, h))
    root = tmp_path / "d"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom((5 << 20) + 12345))  # not a block multiple
    (root / "mid.bin").write_bytes(os.urandom(2 << 20))  # streamed, not pipelined
    assert (
        content_hash_of(str(root), stat_cache=None) == kinetic_data.Data(str(root)).content_hash()
    )
    assert len(used) == 1


def test_a_read_error_in_the_reading_thread_reaches_the_caller(tmp_path, monkeypatch):
    from airflow_provider_kinetic.core.data.hashing import filedigest

    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(3 << 20))
    calls = [0]
    real_readv = os.readv

    def failing(fd, bufs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(5, "Input/output error")
        return real_readv(fd, bufs)

    monkeypatch.setattr(filedigest.os, "readv", failing)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="Input/output error"):
            filedigest._read_pipelined(fd, hashlib.sha256())
    finally:
        os.close(fd)
    assert threading_is_clean()


def threading_is_clean() -> bool:
    import threading

    return not [t for t in threading.enumerate() if t.name == "kinetic-hash-read"]
