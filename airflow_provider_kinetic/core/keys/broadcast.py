"""Tree broadcast: a batch's children get one version of a key (or one shared Data's
content) while the store is read about once.

A rolling tree, built from join order on the scope's board ``bcast/{group}``
(``peers.py``; the group is the window's ``group_id``, else the key and version):

- the getter joins (compare-and-swap: a definite position) and starts serving what
  it receives, file by file, as each file completes (``peer/serve.py``);
- position 0 reads the store; position ``i`` reads from position ``(i - 1) //
  fanout``, so each peer serves at most ``fanout`` children and 1,000 peers at
  fanout 50 are two hops from the store;
- a parent that cannot be reached, or makes no progress for the window's
  ``timeout``, is left for its own parent, and so on up to the root, then the store
  (files already whole are kept; the rest come from the next source);
- every file arrives with the sender's sha256 and is checked on arrival, and the
  whole tree is hashed against the version before it is placed (``fetch.py``): a
  partial or wrong copy is never trusted, and never renamed into ``dest``.

After its copy is placed the getter stays a complete parent until its job ends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.keys.fetch import place_version
from airflow_provider_kinetic.core.keys.joblocal import (
    JOB_ENV,
    peer_id,
    remember,
    scope_or_refuse,
    unreachable_once,
)
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.fetch import (
    PeerNotServing,
    PeerUnavailable,
    drop_others,
    missing,
    peer_manifest,
    pull_peer,
    tree_digests,
)
from airflow_provider_kinetic.core.keys.peer.registry import (
    COMPLETE,
    FAILED,
    RECEIVING,
    Peer,
    PeerRegistry,
    board_name,
)
from airflow_provider_kinetic.core.keys.peer.storepull import pull_store, store_manifest
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow
from airflow_provider_kinetic.core.keys.records import Version
from airflow_provider_kinetic.core.storage import ObjectStore

log = logging.getLogger("kinetic.peers")


def parent_chain(position: int, fanout: int) -> list[int]:
    """The positions to read from, nearest first (the store comes after the last)."""
    chain = []
    while position > 0:
        position = (position - 1) // fanout
        chain.append(position)
    return chain


class Broadcast:
    """One getter's part in one broadcast (``receive`` fills a temporary dir)."""

    def __init__(
        self,
        store: ObjectStore,
        version: Version,
        group: str,
        window: BroadcastWindow,
        what: str,
    ) -> None:
        self.scope, self.token = scope_or_refuse(f"{what} with broadcast=")
        self.store, self.v, self.window, self.what = store, version, window, what
        self.server = peerserve.server(self.token)
        self.registry = PeerRegistry(store, self.scope)
        self.board = board_name("bcast", group)
        self.me = Peer(
            peer_id(), self.server.address, version.version, os.environ.get(JOB_ENV, ""), RECEIVING
        )
        #: Where the bytes came from: {"store": n, "peer": n} (tests, the benchmark).
        self.read: dict[str, int] = {"store": 0, "peer": 0}
        self.sources: list[str] = []
        #: Each file's digest as it arrived (from any source): the tree check reads
        #: none of them again (``fetch.place_version``).
        self.digests = tree_digests()

    def receive(self, tmp: str) -> None:
        """Join, then fill ``tmp`` from the parent chain and, last, the store."""
        position = self.registry.register(self.board, self.me)
        what = f"broadcast copy of {self.what}"
        remember(self.registry, self.board, self.me.peer_id, what, self.linger)
        peers = {p.position: p for p in self.registry.lookup(self.board, self.v.version)}
        files: list[list[Any]] | None = None
        try:
            for pos in parent_chain(position, self.window.fanout):
                parent = peers.get(pos)
                if parent is None or parent.state == FAILED:
                    continue
                try:
                    if files is None:
                        files = self._manifest_of(parent)
                        self._serve(tmp, files)
                    todo = missing(tmp, files)
                    self.read["peer"] += pull_peer(
                        parent.address,
                        self.v.version,
                        self.token,
                        tmp,
                        todo,
                        self._whole,
                        self.window.timeout_s,
                        self._bytes,
                        self.digests,
                    )
                    self.sources.append(parent.address)
                    return
                except PeerUnavailable as exc:
                    self._left(parent, exc)
            # The store's own listing, not a parent's: a parent's list is not trusted.
            files = store_manifest(self.store, self.v.version, self.v.kind, self.v.name)
            drop_others(tmp, files)
            self._serve(tmp, files)
            todo = missing(tmp, files)
            self.read["store"] += pull_store(
                self.store, self.v.version, tmp, todo, self._whole, self._bytes, self.digests
            )
            self.sources.append("store")
        except BaseException:
            self.failed()
            raise

    def failed(self) -> None:
        """Stop serving this copy (its children re-parent)."""
        self.server.set_state(self.v.version, FAILED)
        self.registry.update(self.board, self.me.peer_id, state=FAILED)

    def placed(self, path: str) -> None:
        """The verified copy is at ``path``: serve it from there, as complete."""
        root = self.server.roots.get(self.v.version)
        if root is None:
            return
        if self.v.kind == "file":
            moved = {rel: path for rel in root.ready}
        else:
            moved = {rel: os.path.join(path, *rel.split("/")) for rel in root.ready}
        self.server.set_state(self.v.version, COMPLETE, moved)
        self.registry.update(self.board, self.me.peer_id, state=COMPLETE)

    def linger(self) -> None:
        """At the job's end: wait while a later peer of the board is still receiving
        (it may be reading from us), at most the window's timeout without a change."""
        last, deadline = None, _Deadline(self.window.timeout_s)
        while not deadline.passed():
            waiting = [
                p.peer_id
                for p in self.registry.lookup(self.board, self.v.version)
                if p.position > self.me.position and p.state == RECEIVING
            ]
            if not waiting:
                return
            if waiting != last:
                last, deadline = waiting, _Deadline(self.window.timeout_s)
                log.info(
                    "%s: %d later peer(s) still reading; serving until they finish",
                    self.what,
                    len(waiting),
                )
            time.sleep(0.2)

    def _manifest_of(self, parent: Peer) -> list[list[Any]]:
        """The parent's file list: it may not have joined its own source yet, so a
        404 is retried until the window's timeout."""
        deadline = _Deadline(self.window.timeout_s)
        while True:
            try:
                manifest = peer_manifest(
                    parent.address, self.v.version, self.token, self.window.timeout_s
                )
                return [list(f) for f in manifest["files"]]
            except PeerNotServing:
                if deadline.passed():
                    raise
                deadline.pause()

    def _serve(self, tmp: str, files: list[list[Any]]) -> None:
        """Serve this copy while it arrives (again with the store's list after a
        parent's: the files already whole stay served)."""
        expected = [(f[0], int(f[1])) for f in files]
        known = self.server.roots.get(self.v.version)
        ready = {r: known.ready[r] for r, _ in expected if known and r in known.ready}
        root = peerserve.Root(
            self.v.version,
            self.v.kind,
            self.v.name,
            expected,
            list(self.v.empty_dirs),
            RECEIVING,
            ready,
        )
        self.server.add(root)

    def _bytes(self, nbytes: int) -> None:
        self.server.progressed(self.v.version, nbytes)

    def _whole(self, rel: str, path: str, digest: str) -> None:
        self.server.file_ready(self.v.version, rel, path, digest)

    def _left(self, parent: Peer, exc: PeerUnavailable) -> None:
        if isinstance(exc.__cause__, ConnectionRefusedError):
            log.info("%s: parent %s is gone; trying the next source", self.what, parent.address)
        elif "no progress" in str(exc):
            log.warning("%s: parent %s stalled; re-parenting", self.what, parent.address)
        else:
            unreachable_once(parent.address, exc)


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.end

    def pause(self) -> None:
        """A short wait between two asks of a parent that has not started yet."""
        time.sleep(min(0.05, max(0.0, self.end - time.monotonic())))


def get_broadcast(
    keys: KeyStore,
    ref: str,
    dest: str | os.PathLike[str],
    version: str | None,
    overwrite: bool,
    window: BroadcastWindow,
    report: Callable[[Broadcast], None] | None = None,
) -> dict[str, Any]:
    """``store.get(..., broadcast=window)`` inside a job (see module docstring)."""
    if not isinstance(window, BroadcastWindow):
        raise TypeError(f"broadcast={window!r}: give a BroadcastWindow(fanout=..., timeout=...)")
    _, v = keys.resolve(ref, version)
    key = ref.partition("@")[0]
    cast = Broadcast(keys.store, v, window.group_id or f"{key}@{v.version}", window, f"key {key}")
    try:
        row = place_version(key, v, dest, overwrite, cast.receive, cast.placed, cast.digests)
    except BaseException:
        cast.failed()
        raise
    row.update(broadcast={"read": dict(cast.read), "sources": list(cast.sources)})
    if report is not None:
        report(cast)
    return row
