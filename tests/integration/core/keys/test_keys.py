"""Keys (``core/keys``) on both stores: a local ``file://`` root and a bucket on the
real fake-gcs-server, through the real google-cloud-storage client."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data.refs import cache_key, marker_key
from airflow_provider_kinetic.core.keys import fetch
from airflow_provider_kinetic.core.keys import gc as keys_gc
from airflow_provider_kinetic.core.keys.fetch import KeyVerifyError
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError, KeyNotFound, pointer_key
from airflow_provider_kinetic.core.storage import ObjectStore, PreconditionFailed
from airflow_provider_kinetic.core.storage.swap import ABSENT, read_versioned, swap
from tests.fixtures.waiting import wait_for


@pytest.fixture(autouse=True)
def _own_stat_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "statcache"))


def tree(root: Path, files: dict[str, str], empty: tuple[str, ...] = ()) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel in empty:
        (root / rel).mkdir(parents=True, exist_ok=True)
    return root


def read_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(tmp_path: Path) -> list[str]:
    """What a test wrote beside its sources (the local store and stat cache aside)."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("bucket", "statcache"))


def objects(store: ObjectStore) -> list[str]:
    return store.list("")


def test_put_get_ls_rm_and_versions(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store, who=lambda: {"user": "u", "host": "h"}, keep=3)
    src = tree(tmp_path / "model", {"w.bin": "v1", "cfg/a.json": "{}"}, empty=("logs/empty",))
    first = keys.put("models/churn", src, ttl="7d")
    assert first["uploaded"] is True and first["files"] == 2 and first["size"] == 4
    assert first["by"] == {"user": "u", "host": "h"} and first["kind"] == "dir"

    # Unchanged src: the same version, nothing uploaded, no new object in the store.
    before = objects(store)
    again = keys.put("models/churn", src)
    assert again["uploaded"] is False and again["version"] == first["version"]
    assert objects(store) == before

    (src / "w.bin").write_text("v2")
    second = keys.put("models/churn", src)
    assert second["version"] != first["version"] and second["uploaded"] is True
    (row,) = keys.ls("models/")
    assert (row["key"], row["version"], row["versions"]) == ("models/churn", second["version"], 2)
    assert row["expires"] is not None  # the ttl given at the first put is kept

    out = fetch.get(keys, "models/churn", tmp_path / "out")
    assert read_tree(tmp_path / "out") == {"w.bin": "v2", "cfg/a.json": "{}"}
    assert (tmp_path / "out" / "logs" / "empty").is_dir()
    assert out["version"] == second["version"]
    # An older version by prefix, and pinned with key@version.
    fetch.get(keys, "models/churn", tmp_path / "old", version=first["version"][:10])
    assert read_tree(tmp_path / "old")["w.bin"] == "v1"
    fetch.get(keys, f"models/churn@{first['version']}", tmp_path / "pinned")
    assert read_tree(tmp_path / "pinned")["w.bin"] == "v1"

    # History is cut to keep=3 (newest first); a single file is a key too.
    for i in range(3):
        (src / "w.bin").write_text(f"v{i + 3}")
        keys.put("models/churn", src)
    state = keys.state("models/churn")
    assert state is not None and len(state.versions) == 3
    assert first["version"] not in {v.version for v in state.versions}
    with pytest.raises(KeyNotFound, match="is not a kept version"):
        fetch.get(keys, "models/churn", tmp_path / "gone", version=first["version"])
    keys.put("models/readme", src / "cfg" / "a.json")
    fetch.get(keys, "models/readme", tmp_path / "readme.json")
    assert (tmp_path / "readme.json").read_text() == "{}"
    (tmp_path / "into").mkdir()
    got = fetch.get(keys, "models/readme", tmp_path / "into")  # a dir: the file goes in it
    assert got["dest"] == str(tmp_path / "into" / "a.json")

    # rm: one version moves the pointer to the next; a key; a prefix (recursive only).
    head, nxt = state.versions[0].version, state.versions[1].version
    assert keys.rm("models/churn", head)[0]["version"] == head
    assert keys.ls("models/churn")[0]["version"] == nxt
    with pytest.raises(KeyNotFound, match="recursive"):
        keys.rm("models")
    would = keys.rm("models", recursive=True, dry_run=True)
    assert {r["key"] for r in would} == {"models/churn", "models/readme"}
    assert len(keys.ls()) == 2
    assert {r["key"] for r in keys.rm("models", recursive=True)} == {
        "models/churn",
        "models/readme",
    }
    assert keys.ls() == []
    assert store.exists(marker_key(second["version"]))  # content stays until data gc


def test_missing_key_and_version_name_the_nearest(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    src = tree(tmp_path / "d", {"a": "1"})
    keys.put("models/churn", src)
    keys.put("models/fraud", src)
    with pytest.raises(KeyNotFound, match=r"'models/chrun'.*nearest keys: models/churn"):
        fetch.get(keys, "models/chrun", tmp_path / "x")
    with pytest.raises(KeyNotFound, match="'abcdef' is not a kept version"):
        fetch.get(keys, "models/churn", tmp_path / "x", version="abcdef")
    with pytest.raises(KeyNotFound, match="nearest keys: models/fraud"):
        keys.rm("models/frod")
    assert not (tmp_path / "x").exists()


def test_dest_that_exists_is_refused_unless_overwrite(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    keys.put("k", tree(tmp_path / "d", {"a": "new"}))
    dest = tree(tmp_path / "dest", {"old": "x"})
    with pytest.raises(KeyNameError, match=r"dest .*dest' is a directory that is not empty"):
        fetch.get(keys, "k", dest)
    assert read_tree(dest) == {"old": "x"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(KeyNameError, match="exists: give a path that does not exist"):
        fetch.get(keys, "k", tmp_path / "file")
    fetch.get(keys, "k", dest, overwrite=True)
    assert read_tree(dest) == {"a": "new"}  # replaced whole, nothing of the old left
    (tmp_path / "empty").mkdir()
    fetch.get(keys, "k", tmp_path / "empty")
    assert read_tree(tmp_path / "empty") == {"a": "new"}
    assert leftovers(tmp_path) == ["d", "dest", "empty", "file"]


def test_a_corrupted_blob_fails_verification_and_writes_nothing(
    store: ObjectStore, tmp_path: Path
) -> None:
    keys = KeyStore(store)
    row = keys.put("data/set", tree(tmp_path / "d", {"a.txt": "good bytes", "b.txt": "fine"}))
    obj = f"{cache_key(row['version'])}/a.txt"
    if store.scheme == "file":
        path = Path(store.bucket, *obj.split("/"))
        path.chmod(0o644)
        path.write_text("evil bytes")
    else:
        store.write_bytes(obj, b"evil bytes")
    with pytest.raises(KeyVerifyError, match=f"version {row['version']}.*corrupted"):
        fetch.get(keys, "data/set", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert leftovers(tmp_path) == ["d"]  # no temp dir left beside dest


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "empty key"),
        ("a/../b", "'..' segment"),
        ("/abs", "starts with '/'"),
        ("a@b@c", "'@' outside a version"),
        ("a@b", "'@' outside a version"),
        ("sp ace", "character(s) ' '"),
        ("a//b", "an empty segment"),
        ("a/b/", "an empty segment"),
        ("ü", "character(s) 'ü'"),
    ],
)
def test_bad_keys_are_refused_before_anything_moves(
    store: ObjectStore, tmp_path: Path, key: str, says: str
) -> None:
    keys = KeyStore(store)
    src = tree(tmp_path / "d", {"a": "1"})
    before = objects(store)
    for call in (
        lambda: keys.put(key, src),
        lambda: fetch.get(keys, key, tmp_path / "out"),
        lambda: keys.rm(key),
    ):
        with pytest.raises(KeyNameError, match="letters, digits") as err:
            call()
        assert repr(key) in str(err.value) and says in str(err.value)
    assert objects(store) == before and not (tmp_path / "out").exists()


def test_bad_versions_ttls_and_special_files(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    src = tree(tmp_path / "d", {"a": "1"})
    with pytest.raises(KeyNameError, match="'v1' is not valid: a version is a content hash"):
        fetch.get(keys, "k", tmp_path / "o", version="v1")
    with pytest.raises(KeyNameError, match="ttl 'soon' is not valid: a duration such as"):
        keys.put("k", src, ttl="soon")
    with pytest.raises(KeyNameError, match="does not exist"):
        keys.put("k", tmp_path / "nope")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match=r"fifo'.*a FIFO: only files and directories"):
        keys.put("k", tmp_path / "fifo")
    os.mkfifo(src / "pipe")
    with pytest.raises(ValueError, match=r"contains .*pipe'.*a FIFO"):
        keys.put("k", src)
    sock_dir = tree(tmp_path / "s", {"a": "1"})
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_dir / "sock"))
        with pytest.raises(ValueError, match="a socket"):
            keys.put("k", sock_dir)
    assert objects(store) == [] or keys.ls() == []


def test_compare_and_swap_refuses_a_stale_token(store: ObjectStore) -> None:
    obj = "default/keys/x/@key.json"
    assert read_versioned(store, obj) == (None, ABSENT)
    swap(store, obj, b"one", ABSENT)
    data, token = read_versioned(store, obj)
    assert data == b"one" and token != ABSENT
    with pytest.raises(PreconditionFailed):
        swap(store, obj, b"two", ABSENT)  # someone else created it first
    swap(store, obj, b"two", token)
    with pytest.raises(PreconditionFailed):
        swap(store, obj, b"three", token)  # moved since we read it
    assert read_versioned(store, obj)[0] == b"two"
    swap(store, obj, None, read_versioned(store, obj)[1])
    assert read_versioned(store, obj) == (None, ABSENT)


def test_expiry_and_gc_view(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    short = keys.put("tmp/short", tree(tmp_path / "a", {"a": "short"}), ttl="1h")
    kept = keys.put("tmp/kept", tree(tmp_path / "b", {"b": "kept"}))
    old = keys.put("tmp/kept", tree(tmp_path / "b", {"b": "kept v2"}))
    assert keys_gc.referenced_hashes(keys) == {short["version"], kept["version"], old["version"]}
    later = time.time() + 2 * 3600
    dry = keys_gc.expire(keys, later, dry_run=True)
    assert [s.key for s in dry] == ["tmp/short"] and keys.state("tmp/short") is not None
    assert [s.key for s in keys_gc.expire(keys, later)] == ["tmp/short"]
    assert keys.state("tmp/short") is None
    assert keys_gc.referenced_hashes(keys, later) == {kept["version"], old["version"]}
    assert not store.exists(pointer_key("tmp/short"))


def test_an_expired_key_is_unreadable_before_gc(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    keys.put("tmp/blink", tree(tmp_path / "a", {"a": "x"}), ttl=0.001)
    wait_for("the ttl to pass", lambda: keys.state("tmp/blink").expired(), timeout=10)
    with pytest.raises(KeyNotFound, match="'tmp/blink' expired at"):
        fetch.get(keys, "tmp/blink", tmp_path / "out")
    assert keys.state("tmp/blink") is not None and not (tmp_path / "out").exists()
