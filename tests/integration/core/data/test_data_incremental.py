"""The incremental Data layout (``data_layout="files"``, the default) on both stores: one
object per distinct file content and a manifest per tree, so a changed file uploads only
itself, an unchanged one is stored once across versions and trees, concurrent uploads
of the same content send it once, the runner assembles and verifies the tree, and
``data gc`` deletes a file object only when no manifest left names it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data import cache as datacache
from airflow_provider_kinetic.core.data.manifest import Manifest
from airflow_provider_kinetic.core.data.refs import (
    FILES_PREFIX,
    cache_key,
    file_key,
    marker_key,
    tree_key,
)
from airflow_provider_kinetic.core.data.schemes.download import (
    DataHashMismatch,
    download_from_store,
)
from airflow_provider_kinetic.core.data.schemes.local import LocalPathScheme
from airflow_provider_kinetic.core.storage import ObjectStore, file_uri_path
from tests.fixtures.cli import run_cli
from tests.fixtures.local_conn import local_extra, set_local_conn
from tests.fixtures.stores import Counting


def make_tree(root: Path, n: int = 12) -> None:
    for i in range(n):
        path = root / f"d{i % 3}" / f"f{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"file {i} ".encode() * (100 + i))


def files_bytes(store: ObjectStore) -> int:
    return sum(len(store.read_bytes(k)) for k in store.list(FILES_PREFIX + "/"))


def test_a_changed_file_uploads_only_itself_and_the_store_grows_by_it(
    store: ObjectStore, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    make_tree(tree)
    counting = Counting(store)
    first = Data(str(tree))
    assert datacache.upload_data(counting, first) is True
    total = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    manifest = Manifest.decode(store.read_bytes(tree_key(first.content_hash())), "m")
    assert len(manifest.files) == 12 and manifest.total_bytes == total
    assert files_bytes(store) == total
    grown_before = files_bytes(store)
    changed = tree / "d1" / "f04.bin"
    changed.write_bytes(changed.read_bytes() + b"appended")
    counting.writes.clear()
    second = Data(str(tree))
    assert datacache.upload_data(counting, second) is True
    body = len(store.read_bytes(tree_key(second.content_hash())))
    sent = {k for k in counting.writes if k.startswith(FILES_PREFIX)}
    assert len(sent) == 1 and counting.data_bytes() <= changed.stat().st_size + body + 64
    assert files_bytes(store) - grown_before == changed.stat().st_size  # only the new file
    if store.scheme == "file":  # the entry dir (read by jobs, volumes, FUSE) is linked
        entry = Path(store.bucket, cache_key(second.content_hash()))
        assert store.exists(marker_key(second.content_hash()))
        blob = Path(file_uri_path(store.uri(file_key(manifest.files[0].sha256))))
        assert (entry / manifest.files[0].rel).stat().st_ino == blob.stat().st_ino
    counting.writes.clear()
    assert datacache.upload_data(counting, Data(str(tree))) is False  # a hit
    assert counting.writes == {}


def test_a_file_shared_by_two_trees_is_stored_once(store: ObjectStore, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "x").mkdir(parents=True)
    b.mkdir()
    (a / "x" / "weights.bin").write_bytes(b"W" * 5000)
    (b / "renamed.bin").write_bytes(b"W" * 5000)
    (b / "other.txt").write_bytes(b"other")
    datacache.upload_data(store, Data(str(a)))
    counting = Counting(store)
    datacache.upload_data(counting, Data(str(b)))
    assert sorted(k for k in counting.writes if k.startswith(FILES_PREFIX)) == [
        file_key(__import__("hashlib").sha256(b"other").hexdigest())
    ]


def test_concurrent_uploads_of_the_same_content_send_it_once(
    store: ObjectStore, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    make_tree(tree, 30)
    counting = Counting(store)
    results: list[bool] = []
    gate = threading.Barrier(3)

    def upload() -> None:
        data = Data(str(tree))
        data.content_hash()
        gate.wait()
        results.append(datacache.upload_data(counting, data))

    threads = [threading.Thread(target=upload) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [False, False, True]
    assert len([k for k in counting.writes if k.startswith(FILES_PREFIX)]) == 30
    assert not [k for k in store.list("default/data-trees/") if k.endswith(".claim")]


def test_a_claim_left_by_a_killed_uploader_does_not_hold_the_next_upload(
    store: ObjectStore, tmp_path: Path
) -> None:
    import socket
    import subprocess
    import sys

    from airflow_provider_kinetic.core.data import incremental

    tree = tmp_path / "tree"
    make_tree(tree, 3)
    data = Data(str(tree))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    claim = {"host": socket.gethostname(), "pid": int(gone.stdout), "at": 2e9}
    store.write_bytes(incremental.claim_key(data.content_hash()), json.dumps(claim).encode())
    assert datacache.upload_data(store, data) is True
    assert not store.exists(incremental.claim_key(data.content_hash()))


def test_the_runner_assembles_and_verifies_a_manifest(store: ObjectStore, tmp_path: Path) -> None:
    if store.scheme == "file":
        pytest.skip("a local store's ref names its linked entry dir (test_local_data_view.py)")
    tree = tmp_path / "tree"
    make_tree(tree)
    (tree / "empty").mkdir()
    data = Data(str(tree))
    datacache.upload_data(store, data)
    ref, _ = LocalPathScheme().ref(data, store, None)
    assert ref["uri"] == store.uri(tree_key(data.content_hash()))
    got = download_from_store(ref, str(tmp_path / "got"))
    for path in tree.rglob("*"):
        twin = Path(got, path.relative_to(tree))
        assert twin.is_dir() if path.is_dir() else twin.read_bytes() == path.read_bytes()
    single = tmp_path / "one.bin"
    single.write_bytes(b"lone file")
    lone = Data(str(single))
    datacache.upload_data(store, lone)
    lone_ref, _ = LocalPathScheme().ref(lone, store, None)
    assert Path(download_from_store(lone_ref, str(tmp_path / "lone"))).read_bytes() == b"lone file"
    # A file object whose bytes are not its name: refused, removed, the manifest goes.
    manifest = Manifest.decode(store.read_bytes(tree_key(data.content_hash())), "m")
    bad = file_key(manifest.files[0].sha256)
    store.write_bytes(bad, b"tampered")
    with pytest.raises(DataHashMismatch, match="holds other bytes than its name"):
        download_from_store(ref, str(tmp_path / "bad"))
    assert not store.exists(tree_key(data.content_hash())) and not store.exists(bad)
    assert not (tmp_path / "bad").exists()
    assert datacache.upload_data(store, Data(str(tree))) is True  # the next submit heals it
    assert store.read_bytes(bad) == (tree / manifest.files[0].rel).read_bytes()


def test_data_gc_deletes_a_file_object_only_when_no_kept_manifest_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = "kn_incremental"
    root = set_local_conn(monkeypatch, tmp_path / "root", conn)
    from airflow_provider_kinetic.core.config import KineticConfig

    store = KineticConfig(**local_extra(root)).store()
    tree = tmp_path / "tree"
    make_tree(tree, 4)
    old = Data(str(tree))
    datacache.upload_data(store, old)
    changed = tree / "d0" / "f00.bin"
    changed.write_bytes(b"version two")
    new = Data(str(tree))
    datacache.upload_data(store, new)
    objects = store.list(FILES_PREFIX + "/")
    assert len(objects) == 5  # four files, one of them in two versions
    for key in objects:  # every file object older than gc's floor for in-flight uploads
        path = file_uri_path(store.uri(key))
        os.utime(path, (1_000_000_000, 1_000_000_000))
    newer = Manifest.decode(store.read_bytes(tree_key(new.content_hash())), "m").shas()
    older = Manifest.decode(store.read_bytes(tree_key(old.content_hash())), "m").shas()
    only_old = older - newer
    assert len(only_old) == 1
    # Keep the new version young: gc collects entries older than --older-than only.
    gc = ["data", "gc", "--older-than", "1h", "--conn-id", conn, "-o", "json", "--force"]
    os.utime(file_uri_path(store.uri(marker_key(old.content_hash()))), (1e9, 1e9))
    out = run_cli(*gc)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    deleted = {(r["hash"], r["kind"]) for r in rows if r.get("action") == "deleted"}
    assert deleted == {(old.content_hash(), "data"), (next(iter(only_old)), "file")}
    left = {k.rsplit("/", 1)[1] for k in store.list(FILES_PREFIX + "/")}
    assert left == newer  # every object the kept manifest names is still there
    assert not store.exists(tree_key(old.content_hash()))
    entry = Path(store.bucket, cache_key(new.content_hash()))
    assert Data(str(entry)).content_hash() == new.content_hash()


def test_files_over_the_inline_size_are_streamed_and_checked_after(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kinetic.core.data import incremental

    monkeypatch.setattr(incremental, "INLINE_BYTES", 500)  # every file here is "big"
    tree = tmp_path / "tree"
    make_tree(tree, 4)
    data = Data(str(tree))
    assert datacache.upload_data(store, data) is True
    manifest = Manifest.decode(store.read_bytes(tree_key(data.content_hash())), "m")
    for f in manifest.files:
        assert store.read_bytes(file_key(f.sha256)) == (tree / f.rel).read_bytes()
