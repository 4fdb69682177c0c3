"""The native stat comparison (``core/data/hashing/_lstatcmp.c``) agrees with ``os.lstat``, and a
re-hash uses it where it is built (``$KINETIC_REQUIRE_NATIVE=1``, as the test command
sets, makes its absence a failure)."""

from __future__ import annotations

import os
import time
import types
from array import array
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import content_hash_of
from airflow_provider_kinetic.core.data.hashing import fastlstat, treehash
from airflow_provider_kinetic.core.data.hashing.statcache import StatCache
from tests.fixtures.native import require_native


@pytest.fixture(autouse=True)
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    require_native(monkeypatch)


def record_of(directory: Path, names: list[bytes], pad: int = 0) -> tuple[array, array]:
    """The record's arrays for ``names``, after ``pad`` unrelated entries."""
    inodes, numbers = array("Q", [7] * pad), array("q", [1, 2, 3] * pad)
    for name in names:
        st = os.lstat(os.path.join(os.fsencode(directory), name))
        inodes.append(st.st_ino)
        numbers.extend((st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return inodes, numbers


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, list[bytes], int]:
    d = tmp_path / "d"
    d.mkdir()
    for i in range(50):
        (d / f"f{i:02d}").write_bytes(bytes([i]) * i)
    (d / "\u00e9t\u00e9").write_bytes(b"non-ASCII")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    yield d, sorted(os.listdir(os.fsencode(d))), fd
    os.close(fd)


def test_equal_signatures_are_same(files):
    d, names, fd = files
    inodes, numbers = record_of(d, names, pad=3)
    assert fastlstat.compare(fd, names, inodes, numbers, 3) == fastlstat.SAME
    assert fastlstat.compare(fd, [], inodes, numbers, 0) == fastlstat.SAME


def test_each_fact_is_compared(files, tmp_path):
    d, names, fd = files
    inodes, numbers = record_of(d, names)
    for index, field in [(0, "inode"), (5, "size"), (10, "mtime"), (20, "ctime")]:
        changed_i, changed_n = array("Q", inodes), array("q", numbers)
        if field == "inode":
            changed_i[index] += 1
        else:
            changed_n[3 * index + ["size", "mtime", "ctime"].index(field)] += 1
        got = fastlstat.compare(fd, names, changed_i, changed_n, 0)
        assert got == fastlstat.DIFFERENT, field


def test_changed_byte_with_mtime_restored_differs(files):
    """The case a size + mtime cache misses: the write moved ctime."""
    d, names, fd = files
    inodes, numbers = record_of(d, names)
    target = d / "f09"
    st = target.stat()
    deadline = time.monotonic() + 5
    while target.stat().st_ctime_ns == st.st_ctime_ns:  # the fs clock must move on
        target.write_bytes(b"\x10" * 9)
        assert time.monotonic() < deadline
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert fastlstat.compare(fd, names, inodes, numbers, 0) == fastlstat.DIFFERENT


def test_missing_file_is_gone(files):
    d, names, fd = files
    inodes, numbers = record_of(d, names)
    (d / "f33").unlink()
    assert fastlstat.compare(fd, names, inodes, numbers, 0) == fastlstat.GONE


def test_symlink_is_not_followed(files, tmp_path):
    d, names, fd = files
    inodes, numbers = record_of(d, names)
    os.unlink(d / "f01")
    os.symlink(d / "f02", d / "f01")  # the target's facts would match f02's record
    inodes[1], numbers[3:6] = inodes[2], numbers[6:9]
    assert fastlstat.compare(fd, names, inodes, numbers, 0) == fastlstat.DIFFERENT


def test_bad_input_is_refused(files):
    d, names, fd = files
    inodes, numbers = record_of(d, names)
    assert fastlstat.compare(fd, [os.fsdecode(n) for n in names], inodes, numbers, 0) is None
    with pytest.raises(ValueError, match="shorter"):
        fastlstat.compare(fd, names, inodes, numbers, 1)
    with pytest.raises(ValueError, match="shorter"):
        fastlstat.compare(fd, names, inodes, numbers, -1)
    with pytest.raises(ValueError, match="NUL"):
        fastlstat.compare(fd, [b"f0\x001"], inodes, numbers, 0)
    with pytest.raises(TypeError, match="bytes"):
        fastlstat.compare(fd, [b"f00", "f01"], inodes, numbers, 0)


def test_rehash_uses_the_native_path_where_built(tmp_path, monkeypatch):
    """A re-hash of directories of files only asks the extension, never ``os.lstat``
    per file; switched off, the Python path decides, with the same hash."""
    root = tmp_path / "data"
    for i in range(40):
        (root / f"s{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / f"s{i % 4}" / f"p{i}").write_bytes(os.urandom(64))
    cache = StatCache(str(tmp_path / "cache"), clock=lambda: time.time_ns() + 10**10)
    first = content_hash_of(str(root), stat_cache=cache)
    calls = {"native": 0, "python": 0}
    real_native, real_python = fastlstat._lstatcmp.compare, treehash.lstat_sigs

    def native(*args):  # type: ignore[no-untyped-def]
        calls["native"] += 1
        return real_native(*args)

    def python(*args):  # type: ignore[no-untyped-def]
        calls["python"] += 1
        return real_python(*args)

    monkeypatch.setattr(fastlstat, "_lstatcmp", types.SimpleNamespace(compare=native))
    monkeypatch.setattr(treehash, "lstat_sigs", python)
    assert content_hash_of(str(root), stat_cache=cache) == first
    assert calls == {"native": 4, "python": 0}
    monkeypatch.setenv(fastlstat.ENV_OFF, "0")
    assert content_hash_of(str(root), stat_cache=cache) == first
    assert calls == {"native": 4, "python": 4}
