"""A broadcast copy is hashed once: each file's digest is the content hash's own,
taken as its bytes arrive (from a peer or the store), so the tree check that decides
whether the copy is trusted reads no file again; and a digest that is not the
peer's, or a file changed after it arrived, is never trusted.

Real peer server on loopback, both stores (a local root and fake-gcs-server).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.data.value import content_hash_of
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer import errors as peererrors
from airflow_provider_kinetic.core.keys.peer import fetch as peerfetch
from airflow_provider_kinetic.core.keys.peer import protocol, storepull
from airflow_provider_kinetic.core.keys.peer import receiving as peerreceiving
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.registry import COMPLETE, peer_token
from airflow_provider_kinetic.core.storage import ObjectStore
from airflow_provider_kinetic.core.storage.base import FileDigests
from tests.fixtures.stores import store  # noqa: F401 - the fixture, by name
from tests.fixtures.waiting import wait_for

TOKEN = peer_token(b"deployment-secret", "digests-test")


def _tree(path: Path, files: int = 12) -> tuple[Path, list[list[object]]]:
    (path / "sub").mkdir(parents=True)
    for i in range(files):
        (path / ("sub" if i % 2 else "") / f"part-{i:02d}.bin").write_bytes(os.urandom(3000 + i))
    listed = sorted(
        [p.relative_to(path).as_posix(), p.stat().st_size] for p in path.rglob("*") if p.is_file()
    )
    return path, listed


def _checked(base: Path, digests: FileDigests) -> tuple[str, int, int]:
    """The tree's hash with ``digests``, and how many files it took from them / read."""
    hits = misses = 0

    def lookup(path: str, prefix: bytes, sig: tuple[int, ...]) -> bytes | None:
        nonlocal hits, misses
        got = digests.lookup(path, prefix, sig)
        hits, misses = hits + (got is not None), misses + (got is None)
        return got

    return content_hash(str(base), "copy", None, lookup).hexdigest, hits, misses


@pytest.fixture
def served(tmp_path: Path):
    src, listed = _tree(tmp_path / "src")
    server = peerserve.PeerServer(TOKEN)
    ready = {str(rel): (str(src / str(rel)), "") for rel, _ in listed}
    version = content_hash_of(str(src), stat_cache=None)
    server.add(
        peerserve.Root(version, "dir", "", [(str(r), int(n)) for r, n in listed], ready=ready)
    )  # type: ignore[call-overload]
    try:
        yield server, version, listed
    finally:
        server.close()


def test_a_peers_copy_is_checked_without_reading_it_again(served, tmp_path: Path) -> None:
    server, version, listed = served
    base, digests, told = tmp_path / "copy", peerreceiving.tree_digests(), {}
    base.mkdir()
    got = peerfetch.pull_peer(
        server.address, version, TOKEN, str(base), listed,
        lambda rel, path, digest: told.__setitem__(rel, digest), 5.0, None, digests,
    )  # fmt: skip
    assert got == sum(int(n) for _, n in listed)
    # What each file was told with is the digest its own children are sent: the
    # content hash's, the same the server sent us.
    for rel, _ in listed:
        assert told[rel] == protocol.file_digest(str(rel), str(base / str(rel)))
    assert _checked(base, digests) == (version, len(listed), 0)
    # A file changed after it arrived is read again, and the copy no longer matches.
    changed = base / str(listed[0][0])
    data = changed.read_bytes()  # random: its first byte flipped, never kept as it was
    changed.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    hexdigest, hits, misses = _checked(base, digests)
    assert (hits, misses) == (len(listed) - 1, 1)
    assert hexdigest != version


def test_a_digest_that_is_not_the_peers_is_not_kept(served, tmp_path: Path) -> None:
    server, version, listed = served
    rel = str(listed[0][0])
    path, _ = server.roots[version].ready[rel]
    server.file_ready(version, rel, path, "0" * 64)  # what a broken parent would send
    base = tmp_path / "copy"
    base.mkdir()
    with pytest.raises(peererrors.PeerUnavailable, match="digest other than the peer's: not kept"):
        peerfetch.pull_peer(
            server.address, version, TOKEN, str(base), [listed[0]], lambda *_: None, 5.0
        )
    assert [p for p in base.rglob("*") if p.is_file()] == []


def test_a_store_read_is_checked_without_reading_it_again(
    store: ObjectStore,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    src, listed = _tree(tmp_path / "src", files=20)
    version = KeyStore(store).put("models/digests", src)["version"]
    base, digests, told = tmp_path / "copy", peerreceiving.tree_digests(), {}
    base.mkdir()
    got = storepull.pull_store(
        store, version, str(base), storepull.store_manifest(store, version, "dir", ""),
        lambda rel, path, digest: told.__setitem__(rel, digest), None, digests,
    )  # fmt: skip
    assert got == sum(int(n) for _, n in listed)
    assert sorted(told) == [rel for rel, _ in listed]
    assert _checked(base, digests) == (version, len(listed), 0)
    # Many small objects are read with the store's own parallelism, not a fixed few:
    # a bucket's round trip needs many requests in flight, a disk does not.
    wide = store.workers_for(2_000, 2_000 * (512 << 10))
    assert wide == (64 if store.scheme == "gs" else 8)


def test_a_file_asked_for_while_its_copy_is_moved_into_place_is_served(
    served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A parent renames its checked copy into place a moment before it tells its
    server the new paths: a child asking in between is served, not refused (a 410
    there sent whole subtrees of a broadcast back to the store)."""
    server, version, listed = served
    rel = str(listed[0][0])
    old, _ = server.roots[version].ready[rel]
    moved = tmp_path / "placed.bin"
    os.rename(old, moved)  # the rename, before set_state
    base = tmp_path / "copy"
    base.mkdir()
    pulled: list[int] = []
    caplog.set_level(logging.DEBUG, logger="kinetic.peers")  # before the request is made
    thread = threading.Thread(
        target=lambda: pulled.append(
            peerfetch.pull_peer(
                server.address, version, TOKEN, str(base), [listed[0]], lambda *_: None, 5.0
            )  # fmt: skip
        )
    )
    thread.start()
    # The child's request is held by the server (nothing there to open) until...
    wait_for("the request held", lambda: "waiting for where it moved" in caplog.text, 10)
    server.set_state(version, COMPLETE, {rel: str(moved)})  # ...the paths follow
    thread.join(10)
    assert pulled == [int(listed[0][1])]
    assert (base / rel).read_bytes() == moved.read_bytes()
