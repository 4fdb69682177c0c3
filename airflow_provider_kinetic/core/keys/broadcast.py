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
  partial or wrong copy is never trusted, and never renamed into ``dest``;
- a parent is not trusted either (``Expected``, ``expected.py``): its file list
  must be the version's (the key's record: its file count and bytes; a Data's: the
  store's listing), no file is read past its listed size, and a parent that sends
  what cannot be the content (``PeerLied``), or a copy from parents that does not
  hash to the version, is dropped whole and read from the store instead, with a
  warning that names the peer and what was wrong.

After its copy is placed the getter stays a complete parent until its job ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.data.hashing.treehash import content_hash
from airflow_provider_kinetic.core.keys.expected import Expected, parent_files
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
from airflow_provider_kinetic.core.keys.peer.errors import PeerLied, PeerUnavailable
from airflow_provider_kinetic.core.keys.peer.fetch import pull_peer
from airflow_provider_kinetic.core.keys.peer.receiving import drop_others, missing, tree_digests
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
        expected: Expected | None = None,
        target: Callable[[str], str] | None = None,
    ) -> None:
        """``expected``: what a parent's list is checked against (None: the store's
        listing, read before a parent is asked); ``target(tmp)``: the path whose
        content hash is the version (default: ``tmp``, or a file key's one file)."""
        self.scope, self.token = scope_or_refuse(f"{what} with broadcast=")
        self.store, self.v, self.window, self.what = store, version, window, what
        self.expected, self.target = expected, target
        self.server = peerserve.server(self.token)
        self.registry = PeerRegistry(store, self.scope)
        self.board = board_name("bcast", group)
        self.me = Peer(
            peer_id(), self.server.address, version.version, os.environ.get(JOB_ENV, ""), RECEIVING
        )
        #: Where the bytes came from: {"store": n, "peer": n} (tests, the benchmark).
        self.read: dict[str, int] = {"store": 0, "peer": 0}
        #: Every byte read, by source (a peer's address, or "store"), kept or not.
        self.read_from: dict[str, int] = {}
        self._reading = "store"
        self._counting = threading.Lock()  # the getter's threads count at once
        #: Peers whose files are in the copy (checked with the tree, not before).
        self.kept_from: list[str] = []
        self.sources: list[str] = []
        #: Each file's digest as it arrived (from any source): the tree check reads
        #: none of them again (``fetch.place_version``).
        self.digests = tree_digests()

    def receive(self, tmp: str) -> None:
        """Join, then fill ``tmp`` from the parent chain and, last, the store."""
        position = self.registry.register(self.board, self.me)
        what = f"broadcast copy of {self.what}"
        remember(self.registry, self.board, self.me.peer_id, what, self.linger)
        try:
            if self._from_parents(tmp, position):
                return
            self._from_store(tmp)
            if self.kept_from and (got := self._hash(tmp)) != self.v.version:
                # Files kept from a parent that then failed were relayed lies.
                log.warning(
                    "%s: the copy with files from peer(s) %s hashes to %s, not %s; "
                    "reading it all from the store",
                    self.what,
                    ", ".join(self.kept_from),
                    got[:12],
                    self.v.version[:12],
                )
                self._reset(tmp)
                self._from_store(tmp)
        except BaseException:
            self.failed()
            raise

    def _from_parents(self, tmp: str, position: int) -> bool:
        """Fill ``tmp`` from the parent chain; True once a parent's copy is whole
        and hashes to the version.  False: the store is to be read (a parent that
        lied left nothing of its own behind)."""
        peers = {p.position: p for p in self.registry.lookup(self.board, self.v.version)}
        files: list[list[Any]] | None = None
        for pos in parent_chain(position, self.window.fanout):
            parent = peers.get(pos)
            if parent is None or parent.state == FAILED:
                continue
            self._reading = parent.address
            try:
                if files is None:
                    files = self._manifest_of(parent)
                    self._serve(tmp, files)
                todo = missing(tmp, files)
                if todo:
                    self.kept_from.append(parent.address)
                got = pull_peer(
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
                digest = self._hash(tmp)
                if digest != self.v.version:
                    raise PeerLied(
                        f"peer {parent.address}: the copy it sent hashes to {digest[:12]}, "
                        f"not to the version {self.v.version[:12]}"
                    )
                self.read["peer"] += got
                self.sources.append(parent.address)
                return True
            except PeerUnavailable as exc:
                self._left(parent, exc)
                if isinstance(exc, PeerLied):
                    self._reset(tmp)
                    return False
        return False

    def _from_store(self, tmp: str) -> None:
        # The store's own listing, not a parent's: a parent's list is not trusted.
        self._reading = "store"
        files = store_manifest(self.store, self.v.version, self.v.kind, self.v.name)
        drop_others(tmp, files)
        self._serve(tmp, files)
        todo = missing(tmp, files)
        self.read["store"] += pull_store(
            self.store, self.v.version, tmp, todo, self._whole, self._bytes, self.digests
        )
        self.sources.append("store")

    def _reset(self, tmp: str) -> None:
        """Drop everything received (a parent lied: none of its files is trusted);
        the copy is served again from nothing."""
        for name in os.listdir(tmp):
            path = os.path.join(tmp, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        self.digests.found.clear()
        self.kept_from.clear()
        known = self.server.roots.get(self.v.version)
        if known is not None:  # still served, as receiving, with no file whole
            self.server.add(
                peerserve.Root(
                    self.v.version,
                    self.v.kind,
                    self.v.name,
                    list(known.expected),
                    list(self.v.empty_dirs),
                    RECEIVING,
                )
            )

    def _hash(self, tmp: str) -> str:
        """The content hash of what ``tmp`` holds (each file's digest as it arrived)."""
        if self.target is not None:
            path = self.target(tmp)
        else:
            path = os.path.join(tmp, self.v.name) if self.v.kind == "file" else tmp
        try:
            return content_hash(path, self.what, None, self.digests.lookup).hexdigest
        except (OSError, ValueError) as exc:  # a file that never arrived
            return f"unreadable ({exc})"

    def source(self) -> str:
        """Where the copy's bytes came from, for an error that names them."""
        return ", ".join(a if a == "store" else f"peer {a}" for a in self.sources) or "nowhere"

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
        """The parent's file list, if it can be this content (``expected.py``)."""
        if self.expected is None:  # a Data: the store's listing is the truth
            listing = store_manifest(self.store, self.v.version, self.v.kind, self.v.name)
            self.expected = Expected.of_listing(listing)
        return parent_files(
            self.expected, parent.address, self.v.version, self.token, self.window.timeout_s
        )

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
        with self._counting:
            self.read_from[self._reading] = self.read_from.get(self._reading, 0) + nbytes
        self.server.progressed(self.v.version, nbytes)

    def _whole(self, rel: str, path: str, digest: str) -> None:
        self.server.file_ready(self.v.version, rel, path, digest)

    def _left(self, parent: Peer, exc: PeerUnavailable) -> None:
        if isinstance(exc, PeerLied):
            log.warning(
                "%s: parent %s sent what cannot be the content (%s); "
                "dropping what came from peers and reading the store",
                self.what,
                parent.address,
                exc,
            )
        elif isinstance(exc.__cause__, ConnectionRefusedError):
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
    group = window.group_id or f"{key}@{v.version}"
    cast = Broadcast(keys.store, v, group, window, f"key {key}", Expected.of_key(v))
    try:
        row = place_version(
            key, v, dest, overwrite, cast.receive, cast.placed, cast.digests, cast.source
        )
    except BaseException:
        cast.failed()
        raise
    row.update(
        broadcast={
            "read": dict(cast.read),
            "sources": list(cast.sources),
            "read_from": dict(cast.read_from),
        }
    )
    if report is not None:
        report(cast)
    return row
