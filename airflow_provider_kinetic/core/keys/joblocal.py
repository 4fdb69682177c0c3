"""``locale="local"``: a job publishes a key from its own disk, peers read it from
the job's runner, and the key ends with the job.

- ``put_local``: hashes ``src`` as ``Data`` does (so the version is the same content
  hash a store put would give), serves its files from this runner's peer server
  (``peer/serve.py``) and registers (address, hash) on the scope's board
  ``local/{key}`` (``peers.py``).  Nothing is uploaded, and the key's pointer in the
  store does not move.  ``ttl=`` makes the registration expire (see below).
- ``get_local``: a getter of the same scope (the job itself, or a child of the same
  batch) reads from the newest registered peer, verified against its hash.  A peer
  whose server is gone (its job ended without unregistering: killed) is skipped and
  its registration removed; a peer that cannot be reached at all (a network policy
  between pods) is skipped with one warning per process.  When no peer serves it,
  the store is read only if it holds the same version (the key was also put there);
  else a clear error.  A registration past its ``ttl`` is never read: with none
  alive the key's store copy is read if the store has the key, else the error says
  the local key expired and when.
- ``ls_local``: inside a job, ``store.ls`` lists the local keys its scope sees
  (``locale="local"`` and the serving address) beside the store's keys.
- ``job_ended``: the runner's end: every registration of this process is removed
  and the log names each local key that ended with the job.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.keys.fetch import place_version
from airflow_provider_kinetic.core.keys.keystore import KeyStore, parse_ttl
from airflow_provider_kinetic.core.keys.names import KeyNameError, KeyNotFound, check_key
from airflow_provider_kinetic.core.keys.peer import serve as peerserve
from airflow_provider_kinetic.core.keys.peer.conn import peer_manifest
from airflow_provider_kinetic.core.keys.peer.errors import PeerForbidden, PeerUnavailable
from airflow_provider_kinetic.core.keys.peer.fetch import pull_peer
from airflow_provider_kinetic.core.keys.peer.registry import (
    BOARD_NAME,
    COMPLETE,
    PEERS_PREFIX,
    Peer,
    PeerError,
    PeerRegistry,
    board_name,
    job_scope,
)
from airflow_provider_kinetic.core.keys.records import Version, iso

log = logging.getLogger("kinetic.peers")

JOB_ENV = "JOB_ID"
LOCALES = ("store", "local")
#: Seconds a getter waits on one local peer without progress before the next one.
LOCAL_STALL_S = 60.0

_lock = threading.Lock()
#: (registry, board, peer id, what it was, what to wait for first) of every
#: registration this process made.
_registered: list[tuple[PeerRegistry, str, str, str, Callable[[], None] | None]] = []
_warned_unreachable = False


def check_locale(locale: object) -> str:
    if locale not in LOCALES:
        raise KeyNameError(f"locale={locale!r}: must be one of {', '.join(map(repr, LOCALES))}")
    return str(locale)


def scope_or_refuse(what: str) -> tuple[str, str]:
    """This job's scope and token; refused (before anything moves) outside a job."""
    try:
        return job_scope()
    except PeerError:
        raise KeyNameError(
            f"{what} works only inside a kinetic job (its runner serves the files to the "
            "job's peers); outside a job use locale='store' (the default)"
        ) from None


def peer_id() -> str:
    return f"{os.environ.get(JOB_ENV, 'job')}-{os.getpid()}-{secrets.token_hex(4)}"


def remember(
    registry: PeerRegistry,
    board: str,
    pid: str,
    what: str,
    linger: Callable[[], None] | None = None,
) -> None:
    """Note a registration for ``job_ended``; ``linger`` runs before it is removed (a
    broadcast parent lets its children finish reading)."""
    with _lock:
        _registered.append((registry, board, pid, what, linger))


def put_local(
    keys: KeyStore, key: str, src: str | os.PathLike[str], ttl: object = None
) -> dict[str, Any]:
    """Publish ``src`` under ``key`` from this job's runner (see module docstring);
    ``ttl``: the registration expires this long after the put (None: with the job)."""
    check_key(key)
    ttl_s = parse_ttl(ttl)  # a bad ttl is refused before anything is served
    scope, token = scope_or_refuse(f"put({key!r}, locale='local')")
    path = os.fspath(src)
    if not os.path.lexists(path):
        raise KeyNameError(f"put src {path!r} does not exist: give a file or a directory")
    data = Data(os.path.abspath(path))
    digest = data.content_hash()
    root, files = data.hashed_files()
    kind = "dir" if data.is_dir else "file"
    served = peerserve.Root(
        version=digest,
        kind=kind,
        name="" if kind == "dir" else os.path.basename(data.local_path),
        expected=[(rel, size) for rel, size in files],
        empty_dirs=data.empty_dirs(),
        ready={rel: (os.path.join(root, *rel.split("/")), "") for rel, _ in files},
    )
    server = peerserve.server(token)
    server.add(served)
    registry, board, pid = PeerRegistry(keys.store, scope), board_name("local", key), peer_id()
    peer = Peer(pid, server.address, digest, os.environ.get(JOB_ENV, ""), COMPLETE)
    size = sum(size for _, size in files)
    expires = None if ttl_s is None else peer.joined + ttl_s
    peer.extra = {"kind": kind, "name": served.name, "by": keys.who()}
    peer.extra.update(size=size, files=len(files), expires=expires)
    registry.register(board, peer)
    remember(registry, board, pid, f"local key {key} ({digest[:12]})")
    log.info(
        "put %s -> %s locale=local: served from %s, nothing uploaded",
        key,
        digest[:12],
        server.address,
    )
    return {
        "key": key,
        "version": digest,
        "size": size,
        "files": len(files),
        "locale": "local",
        "address": server.address,
        "expires": None if expires is None else iso(expires),
        "by": peer.extra["by"],
        "uploaded": 0,
    }


def unreachable_once(address: str, exc: BaseException) -> None:
    """One warning per process when peers cannot be reached (a network policy)."""
    global _warned_unreachable
    if not _warned_unreachable:
        _warned_unreachable = True
        log.warning(
            "peer %s cannot be reached (%s): reading from the store instead. If pods "
            "cannot reach each other (a network policy), allow pod-to-pod traffic on the "
            "peer port within the namespace for peer reads and broadcasts",
            address,
            exc,
        )


def version_of(manifest: dict[str, Any], peer: Peer) -> Version:
    files = manifest["files"]
    return Version(
        version=peer.version,
        epoch=peer.joined,
        size=sum(int(f[1]) for f in files),
        files=len(files),
        kind=manifest["kind"],
        name=manifest["name"],
        empty_dirs=list(manifest.get("empty_dirs") or []),
        by=dict(peer.extra.get("by") or {}),
    )


def get_local(
    keys: KeyStore,
    ref: str,
    dest: str | os.PathLike[str],
    version: str | None,
    overwrite: bool,
) -> dict[str, Any] | str | None:
    """``ref`` from a peer that published it with ``locale="local"`` (its row);
    ``None`` when no peer of this scope registered it (read the store as usual); a
    version when no peer serves it any more but the store holds that version."""
    try:
        scope, token = job_scope()
    except PeerError:
        return None
    key, _, pinned = ref.partition("@")
    want = version or pinned or None
    registry, board = PeerRegistry(keys.store, scope), board_name("local", check_key(key))
    found = [p for p in registry.lookup(board) if want is None or p.version.startswith(want)]
    peers = [p for p in found if not expired(p)]
    if not peers:
        return _expired(keys, key, found) if found else None
    tried: list[str] = []
    for peer in sorted(peers, key=lambda p: p.position, reverse=True):
        try:
            manifest = peer_manifest(peer.address, peer.version, token, LOCAL_STALL_S)
            v = version_of(manifest, peer)

            def receive(tmp: str, p: Peer = peer, m: dict[str, Any] = manifest) -> None:
                pull_peer(p.address, p.version, token, tmp, m["files"], _ignore, LOCAL_STALL_S)

            row = place_version(
                key, v, dest, overwrite, receive, source=lambda a=peer.address: f"peer {a}"
            )
        except PeerForbidden as exc:
            log.warning("local key %s: %s; skipping it", key, exc)
            tried.append(str(exc))
            continue
        except PeerUnavailable as exc:
            if isinstance(exc.__cause__, ConnectionRefusedError):
                log.info("local key %s: %s is gone (its job ended); skipping", key, peer.address)
                registry.unregister(board, peer.peer_id)
            else:
                unreachable_once(peer.address, exc)
            tried.append(str(exc))
            continue
        row.update(locale="local", source=peer.address)
        return row
    return _store_copy(keys, key, peers, tried)


def expired(peer: Peer) -> bool:
    """Whether a registration's ``ttl`` has passed."""
    expires = peer.extra.get("expires")
    return expires is not None and time.time() >= float(expires)


def _expired(keys: KeyStore, key: str, peers: list[Peer]) -> None:
    """Every registration of ``key`` expired: read the store's key if there is one
    (None), else say the local key expired, and when."""
    state = keys.state(key)
    if state is not None and state.versions and not state.expired():
        log.info("local key %s: its ttl passed; reading the store's key", key)
        return None
    when = iso(max(float(p.extra["expires"]) for p in peers))
    raise KeyNotFound(
        f"key {key!r} was published with locale='local' and its ttl passed at {when}; "
        "the store holds no such key: put it again, or with locale='store' for a copy "
        "that outlives the ttl"
    )


def ls_local(keys: KeyStore, prefix: str) -> list[dict[str, Any]]:
    """The local keys under ``prefix`` that this job's scope sees (its newest live
    registration each), as ``ls`` rows with ``locale="local"`` and the address."""
    try:
        scope, _ = job_scope()
    except PeerError:
        return []
    base = f"{PEERS_PREFIX}/{scope}/local/"
    registry, rows = PeerRegistry(keys.store, scope), []
    for obj in keys.store.list(base + prefix):
        if not obj.endswith(f"/{BOARD_NAME}"):
            continue
        key = obj[len(base) : -len(BOARD_NAME) - 1]
        live = [p for p in registry.lookup(board_name("local", key)) if not expired(p)]
        if not live:
            continue
        peer = max(live, key=lambda p: p.position)
        extra, expires = peer.extra, peer.extra.get("expires")
        rows.append(
            {
                "key": key,
                "version": peer.version,
                "time": iso(peer.joined),
                "size": extra.get("size"),
                "files": extra.get("files"),
                "kind": extra.get("kind"),
                "by": dict(extra.get("by") or {}),
                "versions": len({p.version for p in live}),
                "expires": None if expires is None else iso(float(expires)),
                "locale": "local",
                "address": peer.address,
            }
        )
    return rows


def _ignore(_rel: str, _path: str, _sha: str) -> None:
    return None


def _store_copy(keys: KeyStore, key: str, peers: list[Peer], tried: list[str]) -> str:
    """The newest peers' version that the store also holds (read it there); else the
    error."""
    state = keys.state(key)
    held = {v.version for v in state.versions} if state else set()
    for peer in sorted(peers, key=lambda p: p.position, reverse=True):
        if peer.version in held:
            log.info("local key %s: no peer serves it; reading the store's copy", key)
            return peer.version
    versions = ", ".join(sorted({p.version[:12] for p in peers}))
    raise KeyNotFound(
        f"key {key!r} was published with locale='local' (version {versions}), no peer "
        f"serves it to this job ({'; '.join(tried)}), and the store holds no copy of that "
        "version: put it with locale='store' as well for a copy that outlives the job"
    )


def job_ended() -> None:
    """The runner's end: unregister this process's peers and stop its server."""
    with _lock:
        entries = list(_registered)
        _registered.clear()
    for *_, linger in entries:
        if linger is not None:
            try:
                linger()
            except Exception as exc:  # noqa: BLE001 - the job is ending either way
                log.warning("peers: could not wait for readers: %s", exc)
    for registry, board, pid, what, _ in entries:
        try:
            registry.unregister(board, pid)
            log.info("%s ends with the job: its peer registration is removed", what)
        except Exception as exc:  # noqa: BLE001 - a stale entry is skipped by getters
            log.warning(
                "%s ends with the job; its registration could not be removed: %s", what, exc
            )
    peerserve.stop()
