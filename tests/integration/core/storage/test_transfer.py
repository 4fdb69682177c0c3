"""Pods that start fast, and never on bad bytes: the runner's parallel, verified Data
download and the parallel composite upload, on the real client against the real
fake-gcs-server (the runner itself in a real subprocess where it matters)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.refs import cache_key, make_data_ref
from airflow_provider_kinetic.core.data.schemes.download import (
    PARTIAL,
    DataHashMismatch,
    download_from_store,
)
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.storage import GcsStore
from airflow_provider_kinetic.core.storage import gcs_transfer as gt
from airflow_provider_kinetic.core.storage.base import FileDigests
from airflow_provider_kinetic.core.storage.gcs_transfer import CorruptObject, b64_crc
from tests.fixtures.fake_gcs import requires_fake_gcs
from tests.fixtures.waiting import wait_for
from tests.integration.runner.test_runner import REPO_ROOT, read_result, run_runner, stage

pytestmark = requires_fake_gcs
BENCH = REPO_ROOT / "benchmarks"


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def empty_dirs(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_dir() and not any(p.iterdir())
    )


def make_data(root: Path, big: int = 300_000) -> Path:
    """Many small files, empty directories, one big file, a zero-byte file."""
    for i in range(120):
        sub = root / f"d{i % 7}" / ("deep" if i % 3 else "")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}.bin").write_bytes(os.urandom(i * 37 % 5000))
    (root / "empty" / "nested").mkdir(parents=True)
    (root / "also-empty").mkdir()
    (root / "big.bin").write_bytes(os.urandom(big))
    (root / "zero").write_bytes(b"")
    return root


def uploaded_ref(store: GcsStore, data: Data) -> dict:
    """Uploaded as a per-tree entry (kinetic's layout: what these transfers read by
    prefix; a manifest's assembly: test_data_incremental.py)."""
    datacache.upload_data(store, data, layout="kinetic")
    return make_data_ref(
        store.uri(cache_key(data.content_hash())), data.is_dir, empty_dirs=data.empty_dirs()
    )


def test_parallel_download_gives_identical_bytes(fake_gcs, gcs_bucket, tmp_path, monkeypatch):
    """Small files at once, the big one in slices (threshold lowered), empty dirs made,
    and the published tree equals the source; no partial dir is left."""
    src = make_data(tmp_path / "src")
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    ref = uploaded_ref(store, Data(str(src)))
    sliced: list[tuple[str, int]] = []
    real = gt.transfer_manager.download_chunks_concurrently

    def spy(blob, filename, chunk_size, **kw):  # type: ignore[no-untyped-def]
        sliced.append((blob.name.rsplit("/", 1)[-1], chunk_size))
        return real(blob, filename, chunk_size=chunk_size, **kw)

    monkeypatch.setattr(gt.transfer_manager, "download_chunks_concurrently", spy)
    reader = GcsStore(gcs_bucket, client=fake_gcs.client(), sliced_min_bytes=100_000)
    target = tmp_path / "work" / "data" / "0"
    assert download_from_store(ref, str(target), reader) == str(target)
    assert read_tree(target) == read_tree(src)
    assert empty_dirs(target) == empty_dirs(src) == ["also-empty", "empty/nested"]
    # 300,000 bytes in one slice per worker; nothing else sliced
    assert sliced == [("big.bin", -(-300_000 // gt.SLICE_WORKERS))]
    assert sorted(os.listdir(target.parent)) == ["0"]


def test_single_file_data_resolves_to_the_file(fake_gcs, gcs_bucket, tmp_path):
    (tmp_path / "weights.bin").write_bytes(os.urandom(70_000))
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    ref = uploaded_ref(store, Data(str(tmp_path / "weights.bin")))
    path = download_from_store(ref, str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "weights.bin")
    assert Path(path).read_bytes() == (tmp_path / "weights.bin").read_bytes()


def test_an_object_changed_in_the_store_fails_naming_the_file(fake_gcs, gcs_bucket, tmp_path):
    """An entry object rewritten after upload (its own checksum consistent) fails the
    content hash, the error names it, and nothing appears at the target."""
    src = make_data(tmp_path / "src")
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    ref = uploaded_ref(store, Data(str(src)))
    key = f"{cache_key(Data(str(src)).content_hash())}/d3/deep/f10.bin"
    store.write_bytes(key, os.urandom(len((src / "d3/deep/f10.bin").read_bytes())))
    target = tmp_path / "out"
    with pytest.raises(
        DataHashMismatch, match=r"changed after the entry was complete: d3/deep/f10\.bin;"
    ):
        download_from_store(ref, str(target))
    assert not target.exists() and os.listdir(tmp_path) == ["src"]


def test_digests_taken_on_the_way_equal_a_second_read(fake_gcs, gcs_bucket, tmp_path):
    """Each file downloaded whole is SHA-256'd as its bytes arrive (relpath + NUL +
    bytes, kinetic's file digest); the content hash built from them is the entry's
    name, as a full re-read is.  A sliced object is not hashed on the way (read
    again), and a file changed after its download is never answered for."""
    src = make_data(tmp_path / "src")
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    ref = uploaded_ref(store, Data(str(src)))
    entry = ref["uri"].rsplit("/", 1)[-1]
    key = cache_key(entry)
    reader = GcsStore(gcs_bucket, client=fake_gcs.client(), sliced_min_bytes=100_000)
    out = tmp_path / "out"
    digests = FileDigests(lambda rel: rel.encode() + b"\0")
    names = reader.download_prefix(key, str(out), digests=digests)
    files = {str(out / n) for n in names}
    assert set(digests.found) == files - {str(out / "big.bin")}
    for name in names:
        if name != "big.bin":
            want = hashlib.sha256(name.encode() + b"\0" + (out / name).read_bytes()).digest()
            assert digests.found[str(out / name)][1] == want
    known = content_hash(str(out), "out", None, digests.lookup).hexdigest
    assert known == content_hash(str(out), "out", None).hexdigest == entry
    # Another prefix (another relpath rule) is not answered for.
    sig = os.lstat(out / "zero")
    sig4 = (sig.st_ino, sig.st_size, sig.st_mtime_ns, sig.st_ctime_ns)
    assert digests.lookup(str(out / "zero"), b"zero\0", sig4) is not None
    assert digests.lookup(str(out / "zero"), b"other\0", sig4) is None
    # A file replaced after its download (same size, other bytes) is read again.
    victim = out / "d3" / "deep" / "f10.bin"
    fresh = out / "d3" / "deep" / "f10.new"
    fresh.write_bytes(os.urandom(victim.stat().st_size))
    os.replace(fresh, victim)
    again = content_hash(str(out), "out", None, digests.lookup).hexdigest
    assert again == content_hash(str(out), "out", None).hexdigest != entry


@pytest.mark.parametrize(
    ("size", "one_read_max"),
    [(3000, gt.SINGLE_SHOT_MAX_BYTES), (3000, 1000), (300_000, gt.SINGLE_SHOT_MAX_BYTES)],
    ids=["one-read", "streamed", "sliced"],
)
def test_bytes_that_do_not_match_their_checksum_are_refused(
    fake_gcs, gcs_bucket, tmp_path, size, one_read_max
):
    """Bytes that differ from the listed CRC32C (what corruption in the store or on the
    way looks like) raise an error naming the file, whether read in one piece,
    streamed or sliced."""
    bucket = fake_gcs.client().bucket(gcs_bucket)
    bucket.blob("p/a/file.bin").upload_from_string(os.urandom(size))
    (listed,) = list(fake_gcs.client().list_blobs(gcs_bucket, prefix="p/"))
    listed._properties["crc32c"] = b64_crc(google_crc32c.value(b"other bytes"))
    (tmp_path / "a").mkdir()
    pairs = [(listed, str(tmp_path / "a" / "file.bin"))]
    with pytest.raises(CorruptObject, match=r"a/file\.bin \(gs://.*/p/a/file\.bin, generation"):
        gt.download_verified(pairs, 4, slice_min=100_000, single_shot_max=one_read_max)


def _spy_download_many(monkeypatch, before=None):  # type: ignore[no-untyped-def]
    """Record each ``download_many`` call's object names and whether it read each
    object in one piece; ``before`` runs first (between the listing and the reads)."""
    calls: list[tuple[list[str], bool]] = []
    real = gt.transfer_manager.download_many

    def spy(pairs, download_kwargs, **kw):  # type: ignore[no-untyped-def]
        if before is not None:
            before()
        one_read = bool(download_kwargs.get("single_shot_download"))
        calls.append((sorted(b.name.rsplit("/", 1)[-1] for b, _ in pairs), one_read))
        return real(pairs, download_kwargs=download_kwargs, **kw)

    monkeypatch.setattr(gt.transfer_manager, "download_many", spy)
    return calls


@pytest.mark.skipif(not gt._HAS_SINGLE_SHOT, reason="google-cloud-storage without single shot")
def test_small_objects_are_read_in_one_piece_and_the_rest_streamed(
    fake_gcs, gcs_bucket, tmp_path, monkeypatch
):
    """Objects up to the one-read size arrive in one read, bigger ones (below the
    slice size) streamed; either way the bytes, and the digests taken on the way, are
    the objects'."""
    blobs = {"a.bin": os.urandom(900), "b.bin": os.urandom(1000), "c.bin": os.urandom(50_000)}
    bucket = fake_gcs.client().bucket(gcs_bucket)
    for name, data in blobs.items():
        bucket.blob(f"m/{name}").upload_from_string(data)
    listed = sorted(fake_gcs.client().list_blobs(gcs_bucket, prefix="m/"), key=lambda b: b.name)
    calls = _spy_download_many(monkeypatch)
    digests = FileDigests(lambda rel: rel.encode() + b"\0")
    rels = [b.name.removeprefix("m/") for b in listed]
    pairs = [(b, str(tmp_path / rel)) for b, rel in zip(listed, rels, strict=True)]
    assert gt.download_verified(pairs, 4, 100_000, (rels, digests), 1000) == 51_900
    assert calls == [(["a.bin", "b.bin"], True), (["c.bin"], False)]
    for name, data in blobs.items():
        assert (tmp_path / name).read_bytes() == data
        want = hashlib.sha256(name.encode() + b"\0" + data).digest()
        assert digests.found[str(tmp_path / name)][1] == want


@pytest.mark.parametrize("rel", ["d3/deep/f10.bin", "big.bin"], ids=["whole", "sliced"])
def test_an_object_replaced_after_the_listing_is_refused(
    fake_gcs, gcs_bucket, tmp_path, monkeypatch, rel
):
    """Objects are read at the generation the listing gave: one rewritten between the
    listing and its read (same size, other bytes), whole or sliced, is refused with
    the file named, and nothing appears at the target."""
    src = make_data(tmp_path / "src")
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    ref = uploaded_ref(store, Data(str(src)))
    key = f"{cache_key(Data(str(src)).content_hash())}/{rel}"
    size = len((src / rel).read_bytes())
    calls = _spy_download_many(monkeypatch, lambda: store.write_bytes(key, os.urandom(size)))
    reader = GcsStore(gcs_bucket, client=fake_gcs.client(), sliced_min_bytes=100_000)
    target = tmp_path / "out"
    with pytest.raises(CorruptObject, match=rf"{rel} \(gs://.*\) was replaced or deleted"):
        download_from_store(ref, str(target), reader)
    assert calls  # the small objects' reads began after the rewrite (the big one's too)
    assert not target.exists() and os.listdir(tmp_path) == ["src"]


def test_composite_upload_equals_the_file_and_leaves_no_parts(fake_gcs, gcs_bucket, tmp_path):
    src = tmp_path / "big.bin"
    data = os.urandom(5 * (1 << 20) + 12345)
    src.write_bytes(data)
    store = GcsStore(gcs_bucket, client=fake_gcs.client(), chunked_min_bytes=1 << 20)
    assert store.upload_file(str(src), "x/big.bin") == len(data)
    blob = fake_gcs.client().bucket(gcs_bucket).get_blob("x/big.bin")
    assert blob.size == len(data) and blob.crc32c == b64_crc(google_crc32c.value(data))
    assert blob.download_as_bytes() == data
    assert [b.name for b in fake_gcs.client().list_blobs(gcs_bucket)] == ["x/big.bin"]
    assert gt.part_size(len(data), 1 << 20) == 1 << 20  # 6 parts of 1 MiB
    assert gt.part_size(100 << 20, 1 << 20) == 4 << 20  # at most 32 parts


def test_a_failed_composite_upload_leaves_nothing(fake_gcs, gcs_bucket, tmp_path, monkeypatch):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 << 20))
    real, calls = gt._upload_part, []

    def fail_third(part, path, start, length):  # type: ignore[no-untyped-def]
        calls.append(start)
        if start == 2 << 20:
            raise OSError("the network went away")
        real(part, path, start, length)

    monkeypatch.setattr(gt, "_upload_part", fail_third)
    store = GcsStore(gcs_bucket, client=fake_gcs.client(), chunked_min_bytes=1 << 20)
    with pytest.raises(OSError, match="went away"):
        store.upload_files(str(tmp_path), ["big.bin"], "c")
    assert sorted(calls) == [0, 1 << 20, 2 << 20]
    assert list(fake_gcs.client().list_blobs(gcs_bucket)) == []


def digest_mount(mount):
    import hashlib as h
    import os as o

    out = {}
    for dirpath, _, files in o.walk(mount):
        for name in files:
            path = o.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[o.path.relpath(path, mount)] = h.sha256(f.read()).hexdigest()
    return out


def _partials(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if PARTIAL in p.name] if parent.exists() else []


def test_a_killed_download_leaves_nothing_a_later_attempt_trusts(fake_gcs, gcs_bucket, tmp_path):
    """SIGKILL the real runner mid-download (slowed by the benchmark's capped proxy):
    the mount path holds no file; the next runner downloads again, gets the right
    bytes, and removes the dead download's partial dir."""
    src = tmp_path / "src"
    src.mkdir()
    # A small file lands whole early; the 1 MiB ones (read in one piece each) land
    # together ~2 s later, and the one above the one-read size streams for ~10 s
    # after them: bytes are on disk long before the download could be complete.
    sizes = [64 << 10, *[1 << 20] * 4, gt.SINGLE_SHOT_MAX_BYTES + (1 << 20)]
    for i, size in enumerate(sizes):
        (src / f"part{i}.bin").write_bytes(os.urandom(size))
    mount = tmp_path / "mnt" / "dataset"
    store = GcsStore(gcs_bucket, client=fake_gcs.client())
    request = JobRequest(
        func=digest_mount, kwargs={"mount": str(mount)}, volumes={str(mount): Data(str(src))}
    )
    flags = stage(store, request)
    proxy = subprocess.Popen(
        [sys.executable, str(BENCH / "latency_proxy.py"), "--upstream",
         fake_gcs.endpoint.removeprefix("http://"), "--rtt-ms", "5", "--mbps", "0.5"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = proxy.stdout.readline().strip()
        (tmp_path / "tmp").mkdir()  # the killed runner's work dir stays in the test's dir
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path / "tmp"),
               "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}  # fmt: skip
        runner = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_kinetic.runner", *flags],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def some_bytes_in() -> bool:
                return any(
                    f.stat().st_size
                    for p in _partials(mount.parent)
                    for f in p.rglob("*")
                    if f.is_file()
                )

            wait_for("the runner's download to be under way", some_bytes_in, timeout=60)
        finally:
            runner.send_signal(signal.SIGKILL)
            runner.wait()
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=10)
    left = _partials(mount.parent)
    assert len(left) == 1 and not mount.exists()  # cut short: nothing under the name
    proc = run_runner(flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {
        f"part{i}.bin": hashlib.sha256((src / f"part{i}.bin").read_bytes()).hexdigest()
        for i in range(6)
    }
    assert read_result(store, request.job_id)["result"] == expected
    assert _partials(mount.parent) == []  # the dead download's dir is gone


def test_a_gzip_encoded_object_arrives_as_kinetic_gets_it(fake_gcs, gcs_bucket, tmp_path):
    """A user's gs:// object stored gzip-encoded is written as the client hands it over
    (not held to its stored size and CRC32C, which are the compressed bytes')."""
    import gzip

    text = b"kinetic " * 50_000
    blob = fake_gcs.client().bucket(gcs_bucket).blob("u/t.txt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(text))
    (listed,) = list(fake_gcs.client().list_blobs(gcs_bucket, prefix="u/"))
    assert listed.size < len(text)
    plain = fake_gcs.client().bucket(gcs_bucket).blob("u/t.txt").download_as_bytes()
    gt.download_verified([(listed, str(tmp_path / "t.txt"))], 4, slice_min=1000)
    assert (tmp_path / "t.txt").read_bytes() == plain  # what the client itself gives
