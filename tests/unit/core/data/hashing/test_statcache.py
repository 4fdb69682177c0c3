"""The persistent stat cache never returns a stale hash, and a hit reads no file.

Every hash is compared with keras-kinetic 0.0.4's own ``Data.content_hash`` on the
tree as it is at that moment.  Files count as "old enough to cache" through the
cache's clock (moved 10 s ahead) instead of sleeping; where a test needs a later
write to get a new ctime, it waits for the file system's clock to pass the file's
ctime (``fs_clock_past``), a condition on the file system, not a sleep.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import struct
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import Data, content_hash_of, content_hash_tree
from airflow_provider_kinetic.core.data.hashing import fastlstat, filedigest, statcache, treewalk
from airflow_provider_kinetic.core.data.hashing.statcache import NEVER, DirRecord, StatCache
from tests.fixtures.native import require_native

REPO = Path(__file__).resolve().parents[5]


@pytest.fixture(scope="module")
def kinetic() -> types.ModuleType:
    spec = importlib.util.find_spec("kinetic")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("keras-kinetic==0.0.4 is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "data.py")
    mod_spec = importlib.util.spec_from_file_location("_kinetic_data_statcache", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, params=["native", "python"])
def lstat_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs twice: re-hashes compare files with their record natively
    (``core/data/hashing/_lstatcmp.c``) and in Python; both must decide the same."""
    if request.param == "python":
        monkeypatch.setenv(fastlstat.ENV_OFF, "0")
    else:
        require_native(monkeypatch)
    return request.param


@pytest.fixture
def cache(tmp_path: Path) -> StatCache:
    """A cache whose clock runs 10 s ahead: files written by the test count as old."""
    return StatCache(str(tmp_path / "cache"), clock=lambda: time.time_ns() + 10**10)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the hash reads (all reads go through ``_digest_open``)."""
    seen: list[str] = []
    real = filedigest._digest_open

    def spy(fd, relb, st, label, where):  # type: ignore[no-untyped-def]
        seen.append(relb[:-1].decode())
        return real(fd, relb, st, label, where)

    monkeypatch.setattr(filedigest, "_digest_open", spy)
    return seen


def write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(content)
    return root


def tree(tmp_path: Path) -> Path:
    root = write(
        tmp_path / "data",
        {f"shard-{i % 3}/part-{i:03d}.bin": bytes([i]) * (100 + i) for i in range(30)}
        | {"top.txt": b"top", "deep/er/x.txt": b"x", "big.bin": os.urandom(300_000)},
    )
    (root / "empty").mkdir()
    return root


def fs_clock_past(path: Path, scratch: Path) -> None:
    """Return once a new write would get a ctime later than ``path``'s (the file
    system's timestamps are coarser than a nanosecond).  The probe file is written in
    ``scratch``, outside the tree being hashed."""
    probe = scratch / ".clock-probe"
    deadline = time.monotonic() + 5
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_ctime_ns > path.stat().st_ctime_ns:
            probe.unlink()
            return
        assert time.monotonic() < deadline, "the file system clock did not advance"


def check(kinetic: types.ModuleType, root: Path, cache: StatCache) -> str:
    ours = content_hash_of(str(root), stat_cache=cache)
    assert ours == kinetic.Data(str(root)).content_hash()
    return ours


def test_hit_reads_nothing(kinetic, cache, reads, tmp_path):
    root = tree(tmp_path)
    os.symlink(root / "top.txt", root / "link.txt")
    first = check(kinetic, root, cache)
    assert len(reads) == 34  # 33 files and the symlinked one
    reads.clear()
    assert check(kinetic, root, cache) == first
    assert reads == []


def test_single_file_is_cached(kinetic, cache, reads, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(os.urandom(5000))
    first = check(kinetic, path, cache)
    reads.clear()
    assert check(kinetic, path, cache) == first and reads == []
    fs_clock_past(path, tmp_path)
    with open(path, "r+b") as f:
        f.write(bytes([path.read_bytes()[0] ^ 0xFF]))  # a byte that really differs
    assert check(kinetic, path, cache) != first


def test_changed_byte_with_size_and_mtime_restored(kinetic, cache, reads, tmp_path):
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    target = root / "shard-1" / "part-004.bin"
    st = target.stat()
    fs_clock_past(target, tmp_path)
    with open(target, "r+b") as f:
        f.write(b"\xff")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (target.stat().st_size, target.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    reads.clear()
    assert check(kinetic, root, cache) != first
    assert reads == ["shard-1/part-004.bin"]  # only the changed file is read


@pytest.mark.parametrize("change", ["add", "remove", "rename"])
def test_listing_changes(kinetic, cache, reads, tmp_path, change):
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    victim = root / "shard-2" / "part-005.bin"
    fs_clock_past(root / "shard-2", tmp_path)  # so the change moves the directory mtime
    if change == "add":
        (root / "shard-2" / "new.bin").write_bytes(b"new")
    elif change == "remove":
        victim.unlink()
    else:
        victim.rename(root / "shard-2" / "part-005-renamed.bin")
    reads.clear()
    assert check(kinetic, root, cache) != first
    # A rename keeps the inode and stat, but the digest covers the name: reread.
    assert reads == {"add": ["shard-2/new.bin"], "remove": [],
                     "rename": ["shard-2/part-005-renamed.bin"]}[change]  # fmt: skip


def test_replaced_directory(kinetic, cache, tmp_path):
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    old = root / "shard-0"
    stats = {p.name: p.stat() for p in old.iterdir()}
    contents = {p.name: p.read_bytes() for p in old.iterdir()}
    old.rename(tmp_path / "shard-0.old")
    fs_clock_past(tmp_path / "shard-0.old" / "part-000.bin", tmp_path)
    old.mkdir()
    for name, content in contents.items():  # same names, sizes, mtimes; one byte differs
        changed = (b"\x01" + content[1:]) if name == "part-000.bin" else content
        (old / name).write_bytes(changed)
        os.utime(old / name, ns=(stats[name].st_atime_ns, stats[name].st_mtime_ns))
    assert check(kinetic, root, cache) != first


def test_symlink_retargeted_to_a_same_sized_file(kinetic, cache, tmp_path):
    root = tree(tmp_path)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"AAAA")
    b.write_bytes(b"BBBB")
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    os.symlink(a, root / "link.txt")
    first = check(kinetic, root, cache)
    (root / "link.txt").unlink()
    os.symlink(b, root / "link.txt")
    assert check(kinetic, root, cache) != first


def test_racy_files_are_never_stored(kinetic, reads, tmp_path):
    cache = StatCache(str(tmp_path / "cache"))  # the real clock: these files are fresh
    root = tree(tmp_path)
    check(kinetic, root, cache)
    record = cache.load(str(root), root.stat().st_dev, "dir")
    assert record is not None
    assert all(s == NEVER for d in record.dirs.values() for s in d.sigs())
    reads.clear()
    check(kinetic, root, cache)
    assert len(reads) == 33  # nothing trusted: every file read again


def test_writer_between_walk_and_read(kinetic, cache, reads, tmp_path, monkeypatch):
    """A file that changes after its lstat is hashed as read now, and never stored."""
    root = tree(tmp_path)
    check(kinetic, root, cache)
    target = root / "top.txt"
    target.write_bytes(b"TOP")  # changed: the next hash must read it
    fs_clock_past(target, tmp_path)
    real = treewalk.stat_dir

    def racing(fd, path, rel, *args):  # type: ignore[no-untyped-def]
        out = real(fd, path, rel, *args)
        if rel == "":
            target.write_bytes(b"T0P")  # after its lstat, before its read
        return out

    monkeypatch.setattr(treewalk, "stat_dir", racing)
    from airflow_provider_kinetic.core.data.hashing import treehash

    monkeypatch.setattr(treehash, "stat_dir", racing)
    check(kinetic, root, cache)  # what was read: the newest bytes
    record = cache.load(str(root), root.stat().st_dev, "dir")
    assert record is not None
    view = record.dirs[""]
    assert view.sigs()[view.names.index("top.txt")] == NEVER
    monkeypatch.undo()
    reads.clear()
    check(kinetic, root, cache)


def test_change_while_streaming_is_retried(kinetic, cache, tmp_path, monkeypatch):
    root = write(tmp_path / "d", {"big.bin": os.urandom(3 << 20), "small.txt": b"s"})
    calls = []
    real = filedigest._read_stream

    def changing(fd, h):  # type: ignore[no-untyped-def]
        n = real(fd, h)
        if not calls:
            fs_clock_past(root / "big.bin", tmp_path)
            with open(root / "big.bin", "r+b") as f:
                f.write(b"changed")
        calls.append(n)
        return n

    monkeypatch.setattr(filedigest, "_read_stream", changing)
    check(kinetic, root, cache)
    assert len(calls) == 2  # the first read saw the file change and was redone
    view = cache.load(str(root), root.stat().st_dev, "dir").dirs[""]  # type: ignore[union-attr]
    assert view.sigs()[view.names.index("big.bin")] == NEVER


def test_processes_sharing_the_cache(kinetic, tmp_path):
    """Concurrent processes hash (and save) the same trees: no torn record, no
    temporary file left, every hash right."""
    trees = [tree(tmp_path / f"t{i}") for i in range(2)]
    cache_dir = tmp_path / "cache"
    code = (
        "import sys, json\n"
        "from airflow_provider_kinetic.core.data import content_hash_of\n"
        "from airflow_provider_kinetic.core.data.hashing.statcache import StatCache\n"
        "c = StatCache(sys.argv[1], racy_ns=0)\n"
        "print(json.dumps([content_hash_of(p, stat_cache=c) for p in sys.argv[2:] * 5]))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(cache_dir), *map(str, trees)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outputs]
    expected = [kinetic.Data(str(t)).content_hash() for t in trees] * 5
    assert all(json.loads(out) == expected for out, _ in outputs)
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".stc", ".stc"]
    for t in trees:
        assert StatCache(str(cache_dir)).load(str(t), t.stat().st_dev, "dir") is not None


def test_new_process_hit_reads_nothing(kinetic, cache, tmp_path):
    root = tree(tmp_path)
    expected = check(kinetic, root, cache)
    code = (
        "import json, sys\n"
        "from airflow_provider_kinetic.core.data.hashing import filedigest\n"
        "from airflow_provider_kinetic.core.data import Data\n"
        "n = [0]\n"
        "real = filedigest._digest_open\n"
        "def spy(*a):\n"
        "    n[0] += 1\n"
        "    return real(*a)\n"
        "filedigest._digest_open = spy\n"
        "print(json.dumps([Data(sys.argv[1]).content_hash(), n[0]]))\n"
    )
    env = {**os.environ, "KINETIC_STATCACHE_DIR": cache.directory}
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == [expected, 0]


@pytest.mark.parametrize(
    "damage", ["garbage", "truncate", "flip-listing", "flip-digest", "flip-signature"]
)
def test_damaged_record_falls_back_to_hashing(kinetic, cache, tmp_path, damage):
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    (root / "top.txt").write_bytes(b"changed")  # so a partial hit must decode signatures
    path = Path(cache.path_for(str(root), root.stat().st_dev))
    blob = bytearray(path.read_bytes())
    first_part = 48 + sum(struct.unpack_from("<5Q", blob, 8)[:3]) + 4  # then digests
    if damage == "garbage":
        blob = bytearray(b"not a record")
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip-listing":
        blob[first_part - 10] ^= 0xFF  # the listings end the first part
    elif damage == "flip-digest":
        blob[first_part + 40] ^= 0xFF
    else:
        blob[-10] ^= 0xFF  # the signatures are last
    path.write_bytes(bytes(blob))
    assert check(kinetic, root, cache) != first
    assert cache.load(str(root), root.stat().st_dev, "dir") is not None  # rewritten


def test_unusable_cache_directory_means_no_cache(kinetic, tmp_path):
    (tmp_path / "not-a-dir").write_text("x")
    broken = StatCache(str(tmp_path / "not-a-dir" / "cache"))
    root = tree(tmp_path)
    check(kinetic, root, broken)
    check(kinetic, root, broken)


def test_least_recently_used_records_are_pruned(kinetic, tmp_path):
    cache = StatCache(str(tmp_path / "cache"), max_records=2)
    roots = [write(tmp_path / f"r{i}", {"f": bytes([i])}) for i in range(3)]
    for root in roots:
        check(kinetic, root, cache)
    assert len(list((tmp_path / "cache").glob("*.stc"))) == 2
    assert cache.load(str(roots[0]), roots[0].stat().st_dev, "dir") is None  # the oldest


def test_record_round_trip_and_foreign_root(tmp_path):
    dirs = [
        DirRecord("", 7, ["a", "l"], [(1, 2, 3, 4), (5, 6, 7, 8, 99)], b"A" * 32 + b"L" * 32,
                  ["a", "d", "l", "z"], (7, 1, 2, 3)),
        DirRecord("sub/", 7, ["é\udcff"], [NEVER], b"S" * 32, ["é\udcff"], None),
        DirRecord("z/", 7, [], [], b"", [], None),
    ]  # fmt: skip
    record = statcache.decode(statcache.encode("/r", 7, "dir", dirs))
    assert [
        (d.rel, d.names, d.sigs(), d.digests, d.entries, d.facts) for d in record.dirs.values()
    ] == [(d.rel, d.names, d.sigs, d.digests, d.entries, d.facts) for d in dirs]
    cache = StatCache(str(tmp_path / "c"))
    assert cache.save("/r", 7, "dir", dirs)
    assert cache.load("/r", 7, "dir") is not None
    assert cache.load("/r", 7, "file") is None  # a directory's record is not a file's


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", "off")
    assert statcache.default_dir() is None and StatCache.default() is None
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "here"))
    assert statcache.default_dir() == str(tmp_path / "here")
    monkeypatch.delenv("KINETIC_STATCACHE_DIR")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert statcache.default_dir() == str(tmp_path / "home" / "kinetic" / ".statcache")
    monkeypatch.delenv("AIRFLOW_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert statcache.default_dir() == str(
        tmp_path / "xdg" / "airflow-provider-kinetic" / "statcache"
    )


def test_data_pickles_without_its_file_list(kinetic, tmp_path, monkeypatch):
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "cache"))
    root = tree(tmp_path)
    d = Data(str(root))
    h = d.content_hash()
    assert d._tree is not None and len(d.hashed_files()[1]) == 33
    blob = pickle.dumps(d)
    assert len(blob) < 1000  # the file list stays on this machine
    clone = pickle.loads(blob)
    assert clone.content_hash() == h
    assert clone.hashed_files() == d.hashed_files()


def test_unchanged_directories_are_not_listed_again(kinetic, cache, tmp_path, monkeypatch):
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    listed: list[object] = []
    real = os.listdir

    def spy(path="."):  # type: ignore[no-untyped-def]
        listed.append(path)
        return real(path)

    monkeypatch.setattr(os, "listdir", spy)
    assert check(kinetic, root, cache) == first
    assert listed == []  # every directory's facts matched: its cached listing was used
    fs_clock_past(root / "shard-1", tmp_path)
    (root / "shard-1" / "late.bin").write_bytes(b"late")
    assert check(kinetic, root, cache) != first
    assert len(listed) == 1  # only the changed directory was listed


def test_directories_of_files_only_take_the_fast_path(kinetic, cache, reads, tmp_path, monkeypatch):
    """A re-hash vouches for a directory of files only with one ``lstat`` per file:
    the full per-entry scan runs only where there are subdirectories."""
    from airflow_provider_kinetic.core.data.hashing import treehash

    root = tree(tmp_path)
    write(root, {"shard-0/\u00e9t\u00e9.bin": b"non-ASCII name"})
    first = check(kinetic, root, cache)
    scanned: list[str] = []
    real = treehash.stat_dir

    def spy(fd, path, rel, *args):  # type: ignore[no-untyped-def]
        scanned.append(rel)
        return real(fd, path, rel, *args)

    monkeypatch.setattr(treehash, "stat_dir", spy)
    reads.clear()
    hit = content_hash_tree(str(root), stat_cache=cache)
    assert hit.hexdigest == first == kinetic.Data(str(root)).content_hash()
    assert reads == [] and sorted(scanned) == ["", "deep/"]
    # The upload's file list, taken from the record on a hit, is the walk's.
    assert hit.files() == content_hash_tree(str(root), stat_cache=None).files()


def test_fast_path_declines_a_symlinked_file(kinetic, cache, reads, tmp_path):
    """In a directory of files only, a symlinked file's recorded signature is its
    target's: the fast check cannot match it, and the full scan still finds the
    directory unchanged, or a retargeted link changed."""
    root = tree(tmp_path)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"AAAA")
    b.write_bytes(b"BBBB")
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    os.symlink(a, root / "shard-1" / "link.txt")
    first = check(kinetic, root, cache)
    reads.clear()
    assert check(kinetic, root, cache) == first and reads == []
    fs_clock_past(root / "shard-1", tmp_path)
    (root / "shard-1" / "link.txt").unlink()
    os.symlink(b, root / "shard-1" / "link.txt")
    assert check(kinetic, root, cache) != first
    assert reads == ["shard-1/link.txt"]


def test_file_removed_during_the_fast_check(kinetic, cache, tmp_path, monkeypatch):
    """A concurrent writer removes a file after its directory's facts were compared:
    the directory is listed again and the hash is the tree's as it is now."""
    from airflow_provider_kinetic.core.data.hashing import treehash

    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    victim = root / "shard-1" / "part-004.bin"
    real = treehash.lstat_sigs

    def racing(fd, names):  # type: ignore[no-untyped-def]
        if victim.name in map(os.fsdecode, names):
            victim.unlink()  # after the directory's facts matched, before its lstats
        return real(fd, names)

    real_native = fastlstat.compare

    def racing_native(fd, names, *rest):  # type: ignore[no-untyped-def]
        if victim.name in map(os.fsdecode, names):
            victim.unlink()
        return real_native(fd, names, *rest)

    monkeypatch.setattr(treehash, "lstat_sigs", racing)
    monkeypatch.setattr(fastlstat, "compare", racing_native)
    assert check(kinetic, root, cache) != first  # no error, no stale hash
    assert not victim.exists()
    monkeypatch.undo()
    view = cache.load(str(root), root.stat().st_dev, "dir").dirs["shard-1/"]  # type: ignore[union-attr]
    assert "part-004.bin" not in view.names and "part-004.bin" not in view.entries


def test_stored_tree_hash_needs_the_same_directories(kinetic, cache, reads, tmp_path):
    """The hash stored with a record is returned only when the walk met exactly its
    directories: removing a subtree leaves every remaining directory unchanged (its
    parent has no files), yet the hash must change."""
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    record = cache.load(str(root), root.stat().st_dev, "dir")
    assert record is not None and record.hexdigest == first
    fs_clock_past(root / "deep", tmp_path)
    (root / "deep" / "er" / "x.txt").unlink()
    (root / "deep" / "er").rmdir()
    reads.clear()
    assert check(kinetic, root, cache) != first
    assert reads == []


def test_damaged_digests_are_read_only_when_needed(kinetic, cache, reads, tmp_path):
    """A record's second part (digests, signatures) is read only where something
    changed or an upload asks for the file list; damaged, it means hashing as if
    there were no record, and a file list taken from the files again."""
    root = tree(tmp_path)
    first = check(kinetic, root, cache)
    path = Path(cache.path_for(str(root), root.stat().st_dev))
    blob = bytearray(path.read_bytes())
    first_part = 48 + sum(struct.unpack_from("<5Q", blob, 8)[:3]) + 4
    blob[first_part + 5] ^= 0xFF  # a byte of the first digest
    path.write_bytes(bytes(blob))
    reads.clear()
    hit = content_hash_tree(str(root), stat_cache=cache)
    assert hit.hexdigest == first and reads == []  # the stored hash: no digest needed
    assert hit.files() == content_hash_tree(str(root), stat_cache=None).files()
    x = root / "deep" / "er" / "x.txt"
    fs_clock_past(x, tmp_path)
    x.write_bytes(b"y")  # the root, listed first, is still found unchanged
    reads.clear()
    assert check(kinetic, root, cache) != first
    assert len(reads) == 33  # the damage showed: everything hashed anew
    record = cache.load(str(root), root.stat().st_dev, "dir")
    assert record is not None and len(record.dirs[""].sigs()) == 2  # rewritten, whole


def test_a_link_whose_target_goes_or_becomes_a_directory_is_refused(kinetic, cache, tmp_path):
    """A recorded symlinked file whose target is then removed, or replaced by a
    directory, leaves its directory's own facts as they were: the re-hash must still
    look at the link and refuse it (never reuse the record, never skip it)."""
    root = tree(tmp_path)
    target = tmp_path / "target.txt"
    target.write_bytes(b"T")
    os.symlink(target, root / "shard-1" / "link.txt")
    check(kinetic, root, cache)
    target.unlink()
    with pytest.raises(treewalk.DataPathError, match="link.txt.*dangling symlink"):
        content_hash_of(str(root), stat_cache=cache)
    target.mkdir()
    with pytest.raises(treewalk.DataPathError, match="link.txt.*symlink to a directory"):
        content_hash_of(str(root), stat_cache=cache)


def test_empty_dirs_of_a_record_hit(kinetic, cache, tmp_path):
    """A re-hash that the record vouches for still lists the empty directories (the
    fast path's scans take their listing from the record only when asked)."""
    root = tree(tmp_path)
    (root / "deep" / "hollow").mkdir()
    first = content_hash_tree(str(root), stat_cache=cache)
    again = content_hash_tree(str(root), stat_cache=cache)
    assert again.hexdigest == first.hexdigest == kinetic.Data(str(root)).content_hash()
    assert first.empty_dirs() == again.empty_dirs() == ["deep/hollow", "empty"]
    assert content_hash_tree(str(root), stat_cache=None).empty_dirs() == ["deep/hollow", "empty"]
