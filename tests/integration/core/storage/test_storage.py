"""One contract suite for both object stores: LocalStore on tmp_path, GcsStore on the
real fake-gcs-server.  Whatever passes here for ``file://`` must pass for ``gs://``,
which is what lets the local backend stand in for GKE."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.storage import (
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    split_gs_uri,
    store_for_uri,
)
from tests.fixtures.fake_gcs import requires_fake_gcs

REPO_ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(params=["local", pytest.param("gcs", marks=requires_fake_gcs)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(str(tmp_path / "store"))
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    fake_gcs = request.getfixturevalue("fake_gcs")
    return GcsStore(request.getfixturevalue("gcs_bucket"), client=fake_gcs.client())


def make_tree(root: Path, n: int = 200) -> dict[str, bytes]:
    """~n small files in nested dirs with unicode and space names; returns rel -> bytes."""
    dirs = ["", "a", "a/b", "a/b/c", "données", "日本語/ファイル", "with space", "deep/" * 6]
    files: dict[str, bytes] = {}
    for i in range(n):
        d = dirs[i % len(dirs)].strip("/")
        name = ["f", "é", "🎉 party", "ß"][i % 4] + f"-{i}.bin"
        rel = f"{d}/{name}" if d else name
        files[rel] = os.urandom(i % 97) + rel.encode()  # varied sizes, distinct content
    files["empty.txt"] = b""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- single objects ----------------------------------------------------------------


def test_write_read_exists(store: ObjectStore) -> None:
    assert not store.exists("k/v.json")
    store.write_bytes("k/v.json", b'{"a": 1}', content_type="application/json")
    assert store.exists("k/v.json")
    assert store.read_bytes("k/v.json") == b'{"a": 1}'
    store.write_bytes("k/v.json", b"second")  # plain writes overwrite
    assert store.read_bytes("k/v.json") == b"second"
    assert not store.exists("k")  # a "directory" is not an object


def test_if_absent_second_write_fails(store: ObjectStore) -> None:
    store.write_bytes("lock", b"first", if_absent=True)
    with pytest.raises(PreconditionFailed) as exc:
        store.write_bytes("lock", b"second", if_absent=True)
    assert isinstance(exc.value, FileExistsError)
    assert store.read_bytes("lock") == b"first"  # the loser changed nothing


def test_if_absent_race_has_one_winner(store: ObjectStore) -> None:
    wins: list[int] = []
    losses: list[int] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.write_bytes("race", str(i).encode(), if_absent=True)
            wins.append(i)
        except PreconditionFailed:
            losses.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert store.read_bytes("race") == str(wins[0]).encode()


def test_missing_key_raises_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound) as exc:
        store.read_bytes("no/such/key")
    assert isinstance(exc.value, FileNotFoundError)
    assert "no/such/key" in str(exc.value)
    target = tmp_path / "dl" / "x"
    with pytest.raises(ObjectNotFound):
        store.download_file("no/such/key", str(target))
    assert not target.exists()


def test_large_object_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    """9 MiB takes GCS's resumable-upload path (the emulator's Location URL)."""
    data = os.urandom(9 * 1024 * 1024)
    store.write_bytes("big/bytes", data)
    assert store.read_bytes("big/bytes") == data
    src = tmp_path / "big.bin"
    src.write_bytes(data[::-1])
    assert store.upload_file(str(src), "big/file") == len(data)
    store.download_file("big/file", str(tmp_path / "out" / "big.bin"))
    assert (tmp_path / "out" / "big.bin").read_bytes() == data[::-1]


# -- trees -------------------------------------------------------------------------


def test_upload_download_tree_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    total_bytes = sum(len(b) for b in files.values())
    calls: list[tuple[int, int, int]] = []

    sent = store.upload_files(
        str(tmp_path / "src"), list(files), "jobs/j1/data", progress=lambda *a: calls.append(a)
    )

    assert sent == total_bytes
    assert calls[-1] == (len(files), len(files), total_bytes)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # monotonic
    # The objects really exist, one per file, under the prefix.
    assert store.list("jobs/j1/data/") == sorted(f"jobs/j1/data/{r}" for r in files)

    calls.clear()
    rels = store.download_prefix(
        "jobs/j1/data", str(tmp_path / "dst"), progress=lambda *a: calls.append(a)
    )

    assert rels == sorted(files)
    assert calls[-1] == (len(files), len(files), total_bytes)
    assert read_tree(tmp_path / "dst") == files


def test_upload_accepts_generator_and_empty_input(store: ObjectStore, tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_bytes(b"1")
    assert store.upload_files(str(tmp_path), (r for r in ["one.txt"]), "p/") == 1
    assert store.list("p/") == ["p/one.txt"]  # one separator despite the trailing "/"
    calls: list[tuple[int, int, int]] = []
    assert store.upload_files(str(tmp_path), [], "p", progress=lambda *a: calls.append(a)) == 0
    assert calls == [(0, 0, 0)]
    assert store.download_prefix("nothing-here", str(tmp_path / "none")) == []


def test_upload_missing_file_raises(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        store.upload_files(str(tmp_path), ["absent.txt"], "p")


def test_list_is_sorted_prefix_match(store: ObjectStore) -> None:
    for key in ["b/2", "a/z", "a/b/c", "ab", "a/a", "c"]:
        store.write_bytes(key, key.encode())
    assert store.list("a") == ["a/a", "a/b/c", "a/z", "ab"]
    assert store.list("a/") == ["a/a", "a/b/c", "a/z"]
    assert store.list("") == ["a/a", "a/b/c", "a/z", "ab", "b/2", "c"]
    assert store.list("zzz") == []


def test_delete_prefix_removes_exactly_that_prefix(store: ObjectStore) -> None:
    for key in ["run/1/a", "run/1/sub/b", "run/10/c", "run/1x", "other/run/1/d"]:
        store.write_bytes(key, b"x")
    assert store.delete_prefix("run/1") == 2
    assert store.list("") == ["other/run/1/d", "run/10/c", "run/1x"]
    assert store.delete_prefix("run/1/") == 0
    with pytest.raises(ValueError):
        store.delete_prefix("")


def test_unsafe_keys_are_refused(store: ObjectStore, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError):
        store.upload_files(str(tmp_path), ["../f"], "p")
    with pytest.raises(ValueError):
        store.upload_files(str(tmp_path), ["/etc/passwd"], "p")


# -- URIs --------------------------------------------------------------------------


def test_uri_forms(store: ObjectStore) -> None:
    if store.scheme == "gs":
        assert store.uri("a/b") == f"gs://{store.bucket}/a/b"
        assert store.uri() == f"gs://{store.bucket}"
    else:
        assert os.path.isabs(store.bucket)
        assert store.uri("a/b") == "file://" + os.path.join(store.bucket, "a", "b")
        assert store.uri() == "file://" + store.bucket


def test_store_pickles_to_the_same_address(store: ObjectStore) -> None:
    """Stores travel to worker threads/processes by address; clients are rebuilt."""
    store.write_bytes("p.bin", b"pickled")
    copy = pickle.loads(pickle.dumps(store))
    assert (type(copy), copy.uri("p.bin")) == (type(store), store.uri("p.bin"))
    assert copy.read_bytes("p.bin") == b"pickled"


def test_store_for_uri_round_trip(store: ObjectStore) -> None:
    """The resolved store builds its own client (for GCS: anonymous, via the emulator
    environment the fake_gcs fixture set up), as the runner process does."""
    store.write_bytes("deep/key.bin", b"payload")
    other, key = store_for_uri(store.uri("deep/key.bin"))
    assert type(other) is type(store)
    assert other.uri(key) == store.uri("deep/key.bin")
    assert other.read_bytes(key) == b"payload"
    if store.scheme == "gs":
        assert (other.bucket, key) == (store.bucket, "deep/key.bin")
    else:
        assert other.bucket == "/"
        assert key == store.uri("deep/key.bin")[len("file:///") :]


def test_store_for_uri_rejects_other_schemes() -> None:
    with pytest.raises(ValueError, match=r"s3://x.*gs://.*file://"):
        store_for_uri("s3://x")
    with pytest.raises(ValueError):
        store_for_uri("/plain/path")
    with pytest.raises(ValueError):
        store_for_uri("file://relative/path")


def test_split_gs_uri() -> None:
    assert split_gs_uri("gs://bkt/a/b/c") == ("bkt", "a/b/c")
    assert split_gs_uri("gs://bkt") == ("bkt", "")
    for bad in ["gs://", "s3://bkt/a", "bkt/a"]:
        with pytest.raises(ValueError):
            split_gs_uri(bad)


# -- backend specifics ---------------------------------------------------------------


def test_local_store_leaves_no_temp_files_and_hides_them(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    store.write_bytes("d/k", b"1")
    store.write_bytes("d/k", b"2", if_absent=False)
    with pytest.raises(PreconditionFailed):
        store.write_bytes("d/k", b"3", if_absent=True)
    assert sorted(os.listdir(tmp_path / "d")) == ["k"]
    (tmp_path / "d" / ".k.abc.kinetic-tmp").write_bytes(b"half")  # a crashed writer
    assert store.list("d/") == ["d/k"]
    with pytest.raises(ValueError):
        store.read_bytes("../outside")


@requires_fake_gcs
def test_gcs_download_prefix_skips_placeholders_and_refuses_escapes(
    fake_gcs, gcs_bucket: str, tmp_path: Path
) -> None:
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    bucket = fake_gcs.client().bucket(gcs_bucket)
    bucket.blob("t/dir/").upload_from_string(b"")  # console-style folder placeholder
    bucket.blob("t/dir/f").upload_from_string(b"f")
    store = GcsStore(gcs_bucket)  # lazily built client: anonymous, from the environment
    assert store.download_prefix("t", str(tmp_path / "ok")) == ["dir/f"]
    assert read_tree(tmp_path / "ok") == {"dir/f": b"f"}

    bucket.blob("t/../../evil").upload_from_string(b"x")
    with pytest.raises(ValueError, match="unsafe"):
        store.download_prefix("t", str(tmp_path / "bad"))
    assert not (tmp_path / "evil").exists()


@requires_fake_gcs
def test_gcs_many_workers_share_a_wide_pool(fake_gcs, gcs_bucket: str, tmp_path: Path) -> None:
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    files = make_tree(tmp_path / "src", n=64)
    store = GcsStore(gcs_bucket, client=fake_gcs.client(), workers=24)
    store.upload_files(str(tmp_path / "src"), list(files), "w")
    assert len(store.list("w/")) == len(files)
    assert store.client._http.adapters["http://"]._pool_maxsize == 24


def test_import_is_light() -> None:
    """Importing the package must not import Airflow or google-cloud-storage; only
    using GcsStore may (the local backend and the DAG parser never pay for it)."""
    code = textwrap.dedent(
        """
        import sys
        import airflow_provider_kinetic.core.storage as s
        from airflow_provider_kinetic.core.storage import LocalStore, store_for_uri
        store, key = store_for_uri("file:///tmp/x")
        assert isinstance(store, LocalStore), store
        heavy = [m for m in ("airflow", "google.cloud.storage") if m in sys.modules]
        assert not heavy, heavy
        s.GcsStore("bucket")
        assert "google.cloud.storage" in sys.modules
        assert "airflow" not in sys.modules
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


# -- temp files of killed writers (issue 9) -----------------------------------------------

_UPLOAD_CHILD = """
import shutil, sys
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.storage import LocalStore

stall_at = int(sys.argv[3])
real, calls = shutil.copyfileobj, [0]

def copy(src, dst, length=0):
    calls[0] += 1
    if calls[0] == stall_at:  # half a file written, then wait to be killed
        dst.write(src.read(3))
        dst.flush()
        print("STALLED", flush=True)
        sys.stdin.read()
    return real(src, dst, length)

shutil.copyfileobj = copy
store = LocalStore(sys.argv[1])
store.data_layout = "kinetic"  # the per-tree upload's copies (incremental: its own tests)
print("UPLOADED" if datacache.upload_data(store, Data(sys.argv[2])) else "HIT")
"""


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".kinetic-tmp") and p.is_file()]


def test_killed_local_upload_leaves_nothing_in_the_cache_entry(tmp_path: Path) -> None:
    import signal

    from airflow_provider_kinetic.core.data import Data
    from airflow_provider_kinetic.core.data import cache as datacache

    src, root = tmp_path / "src", tmp_path / "store"
    files = make_tree(src, n=40)
    env = {**os.environ, "KINETIC_STATCACHE_DIR": str(tmp_path / "statcache")}
    cmd = [sys.executable, "-c", _UPLOAD_CHILD, str(root), str(src)]
    child = subprocess.Popen(
        [*cmd, "10"], cwd=REPO_ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "STALLED", child.stderr
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    entry = root / datacache.cache_key(Data(str(src)).content_hash())
    staged = _temp_files(root)
    assert staged and all(p.parent == root / ".kinetic-tmp" for p in staged)
    assert not _temp_files(entry) and entry.is_dir()  # the killed upload was under way
    assert not (root / datacache.marker_key(Data(str(src)).content_hash())).exists()

    done = subprocess.run(
        [*cmd, "0"], cwd=REPO_ROOT, env=env, text=True, capture_output=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "UPLOADED", done.stderr
    assert _temp_files(root) == []  # the killed writer's file was swept
    assert read_tree(entry) == files
    assert LocalStore(str(root)).exists(datacache.marker_key(Data(str(src)).content_hash()))


def test_staging_is_hidden_and_only_dead_writers_are_swept(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "store"))
    store.write_bytes("a/b", b"1")
    staging = tmp_path / "store" / ".kinetic-tmp"
    assert not staging.exists()  # removed once empty: a store root stays tidy
    staging.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (staging / f"{dead}-0123.kinetic-tmp").write_bytes(b"half")
    (staging / f"{os.getpid()}-4567.kinetic-tmp").write_bytes(b"in flight")
    assert store.list("") == ["a/b"]
    (tmp_path / "f").write_bytes(b"f")
    store.upload_files(str(tmp_path), ["f"], "p")
    assert sorted(p.name for p in staging.iterdir()) == [f"{os.getpid()}-4567.kinetic-tmp"]


# -- GCS concurrency --------------------------------------------------------------------


@requires_fake_gcs
def test_gcs_workers_follow_the_files_and_the_pool_matches(
    fake_gcs, gcs_bucket: str, tmp_path: Path
) -> None:
    from airflow_provider_kinetic.core.storage import _parallel
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    files = make_tree(tmp_path / "src", n=150)
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    calls: list[tuple[int, int, int]] = []
    store.upload_files(str(tmp_path / "src"), list(files), "w", progress=lambda *a: calls.append(a))
    assert len(store.list("w/")) == len(files)
    assert [c[0] for c in calls] == list(range(1, len(files) + 1))  # after every file
    workers = _parallel.plan_workers(len(files), sum(map(len, files.values())))
    assert workers == _parallel.SMALL_OBJECT_WORKERS  # small files: latency-bound
    assert store.client._http.adapters["http://"]._pool_maxsize >= workers
    assert _parallel.plan_workers(40, 40 * (256 << 20)) == _parallel.MIN_WORKERS  # big: fewer
    assert _parallel.plan_workers(3, 30) == 3 and _parallel.plan_workers(5, 5, fixed=2) == 2


@requires_fake_gcs
def test_gcs_big_files_take_the_composite_upload(
    fake_gcs, gcs_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    """Big files go up as parallel parts composed into one object (the emulator and
    GCS alike); small ones as one request each, and both download back intact."""
    from airflow_provider_kinetic.core.storage import gcs

    composed: list[tuple[str, int]] = []
    real = gcs.upload_composite

    def spy(bucket, path, key, part_bytes, workers):  # type: ignore[no-untyped-def]
        composed.append((key, part_bytes))
        return real(bucket, path, key, part_bytes, workers)

    monkeypatch.setattr(gcs, "upload_composite", spy)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(os.urandom(5000))
    (tmp_path / "src" / "small.bin").write_bytes(b"s")
    store = gcs.GcsStore(gcs_bucket, client=fake_gcs.client(), chunked_min_bytes=4096)
    assert store.upload_files(str(tmp_path / "src"), ["big.bin", "small.bin"], "c") == 5001
    assert composed == [("c/big.bin", -(-5000 // gcs.CHUNK_WORKERS))]
    store.download_prefix("c", str(tmp_path / "dst"))
    assert read_tree(tmp_path / "dst") == read_tree(tmp_path / "src")
    assert store.list("") == ["c/big.bin", "c/small.bin"]  # no part left


_WRITER = textwrap.dedent(
    """
    import sys
    from airflow_provider_kinetic.core.storage import LocalStore

    store, n = LocalStore(sys.argv[1]), int(sys.argv[3])
    for i in range(n):  # small objects, back to back: the staging dir comes and goes
        store.write_bytes(f"w{sys.argv[2]}/{i}.json", b"{}")
    """
)


def test_local_writers_in_many_processes_never_lose_the_staging_dir(tmp_path: Path) -> None:
    """Every writer removes the shared staging dir when it has nothing in flight; other
    processes creating their temp file in it at that moment must retry, not fail
    (seen as ``FileNotFoundError: .kinetic-tmp/...`` with tries writing side by side)."""
    root, n = tmp_path / "store", 300
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), str(w), str(n)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for w in range(6)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, "\n".join(errors)[-3000:]
    store = LocalStore(str(root))
    assert all(len(store.list(f"w{w}/")) == n for w in range(6))
    assert not (root / ".kinetic-tmp").exists()  # nothing left behind
