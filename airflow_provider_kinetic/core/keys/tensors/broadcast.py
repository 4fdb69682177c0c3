"""``store.get(key, dest=state_dict, broadcast=BroadcastWindow(world_size=N))``: one
peer reads the key from the store, the other N-1 receive its tensors through
``torch.distributed``, each filling its own dest in place.

Why torch.distributed and not the file broadcast: the tensors usually end on an
accelerator, and NCCL moves them device to device at interconnect speed (gloo does
the same for CPU tensors).  The backend follows the tensors' device: all on CPU:
gloo; all on CUDA: NCCL; mixed: gloo for the CPU ones and NCCL for the rest.

Order, so that no dest is modified unless every peer's dest fits:

1. rendezvous on the peer registry (``tensors/rendezvous.py``): ranks, rank 0's
   address, every rank connected; when one rank cannot reach rank 0 (a network
   policy between pods), no group is made and every rank reads the store itself,
   with one warning, as the file broadcast does;
2. rank 0 reads and verifies the key (the same path as a plain get) and broadcasts
   the safetensors header (names, dtypes, shapes) and the version's row;
3. every rank checks its own dest against that header; the verdicts are gathered,
   and if any rank's dest does not fit, every rank raises (naming the rank, tensor,
   both shapes or dtypes, and the key) before any tensor is touched;
4. rank 0 fills its dest from the file, then every tensor is broadcast from rank 0
   as raw bytes (so every dtype, bool and float8 included, goes over gloo and NCCL
   alike), straight into the dest when it is contiguous.

The process group is the default group, made and destroyed here: a process that
already runs its own ``torch.distributed`` group is refused (two default groups
cannot coexist).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer.registry import COMPLETE
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow, BroadcastWindowError
from airflow_provider_kinetic.core.keys.tensors import statedict as tensors
from airflow_provider_kinetic.core.keys.tensors.rendezvous import (
    Rendezvous,
    RendezvousError,
    advertise_address,
)


class PeerReadError(KineticError, RuntimeError):
    """Rank 0 could not read the key; every other rank raises this, naming why."""


def backend_for(named: dict[str, Any]) -> str:
    """gloo for CPU tensors, NCCL for CUDA tensors, both for a mix."""
    devices = {t.device.type for t in named.values()}
    if devices <= {"cpu"}:
        return "gloo"
    if devices <= {"cuda"}:
        return "nccl"
    if devices <= {"cpu", "cuda"}:
        return "cpu:gloo,cuda:nccl"
    raise tensors.TensorMismatch(
        f"tensor broadcast supports CPU and CUDA tensors; dest has {sorted(devices)}"
    )


def get(
    keys: KeyStore,
    ref: str,
    dest: Any,
    version: str | None,
    window: BroadcastWindow,
    scope: str | None,
) -> dict[str, Any]:
    """Fill ``dest`` with ``ref``'s tensors among ``window.world_size`` peers of
    ``scope`` (the batch id or the job id); returns the version's row with this
    peer's ``rank`` and ``source`` ("store" for rank 0, "peer" for the rest)."""
    n = window.world_size
    if n is None:
        raise BroadcastWindowError(
            "a tensor broadcast needs BroadcastWindow(world_size=N): every rank of "
            "torch.distributed must join"
        )
    if n == 1:
        row = tensors.get(keys, ref, dest, version)
        row.update(rank=0, world_size=1)
        return row
    if not scope:
        raise RendezvousError(
            f"tensor broadcast of {ref!r} with world_size={n}: runs among a batch's children "
            "or an LWS job's hosts, so call it inside a kinetic job"
        )
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RendezvousError(
            "this process already has a torch.distributed default group; the tensor "
            "broadcast makes its own (get the key without broadcast, then use your group)"
        )
    _, named = tensors.as_named(dest, f"get {ref!r} dest")
    backend = backend_for(named)
    cuda = next((t.device for t in named.values() if t.device.type == "cuda"), None)
    if cuda is not None:
        torch.cuda.set_device(cuda)
    group = window.group_id or (ref if version is None else f"{ref}@{version}")
    rdv = Rendezvous(keys.store, scope, group, n, window.timeout_s)
    rank = rdv.join()
    got: tensors.Fetched | None = None
    try:
        tcp = _reach(dist, rdv, rank, n, keys)
        if tcp is None:  # some rank cannot reach rank 0: each reads the store
            row = tensors.get(keys, ref, dest, version)
            row.update(rank=rank, world_size=n, source="store", backend=None, fallback=True)
            return row
        dist.init_process_group(
            backend, store=tcp, rank=rank, world_size=n, timeout=timedelta(seconds=rdv.timeout_s)
        )
        header, got, failure = _header(keys, ref, version, rank)
        problem = header.get("error") or tensors.check_dest(header, dest, ref)
        verdicts: list[Any] = [None] * n
        dist.all_gather_object(verdicts, problem)
        if rank == 0:  # every rank gave a verdict, so every rank is past the board
            rdv.remove()  # (NCCL's init is lazy: init_process_group alone proves nothing)
        if failure is not None:
            raise failure
        if header.get("error"):
            raise PeerReadError(header["error"])
        bad = [(r, p) for r, p in enumerate(verdicts) if p]
        if bad:
            mine = problem or f"rank {bad[0][0]} of {n}: {bad[0][1]}"
            raise tensors.TensorMismatch(f"{mine}; no peer's dest was modified")
        with torch.no_grad():
            if got is not None:
                tensors.fill(got.path, dest)
            for name in sorted(named):
                _broadcast_into(torch, dist, named[name])
    finally:
        if got is not None:
            got.close()
        if rank == 0:
            rdv.remove()
        if dist.is_initialized():
            dist.destroy_process_group()
    row = dict(header["row"])
    row.update(
        rank=rank,
        world_size=n,
        source="store" if rank == 0 else "peer",
        tensors=len(header["tensors"]),
        backend=backend,
    )
    return row


def _reach(dist: Any, rdv: Rendezvous, rank: int, n: int, keys: KeyStore) -> Any:
    """Rank 0 listens (a TCPStore on a free port) and publishes; the rest connect.
    The TCPStore once every rank reached rank 0; None when one could not."""
    if rank == 0:  # the server listens on every interface; its own client uses loopback
        timeout = timedelta(seconds=rdv.timeout_s)
        tcp = dist.TCPStore(
            "127.0.0.1", 0, n, is_master=True, timeout=timeout, wait_for_workers=False
        )
        rdv.publish(advertise_address(keys.store), tcp.port)
    else:
        host, port = rdv.wait_address()
        try:
            tcp = dist.TCPStore(host, port, n, is_master=False, timeout=rdv.connect_timeout())
        except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError
            rdv.unreachable(f"{host}:{port}", exc)
            return None
        tcp.set_timeout(timedelta(seconds=rdv.remaining_s()))
        rdv.mark(COMPLETE)
    return tcp if rdv.wait_all() else None


def _header(
    keys: KeyStore, ref: str, version: str | None, rank: int
) -> tuple[dict[str, Any], tensors.Fetched | None, BaseException | None]:
    """Rank 0 reads the key and broadcasts its header (or why it could not)."""
    import torch.distributed as dist

    got: tensors.Fetched | None = None
    failure: BaseException | None = None
    box: list[Any] = [None]
    if rank == 0:
        try:
            got = tensors.Fetched(keys, ref, version)
            row = {k: v for k, v in got.row.items() if k != "dest"}
            box[0] = {**got.header, "row": row}
        except Exception as exc:  # noqa: BLE001 - told to every peer, raised here below
            failure = exc
            box[0] = {"error": f"rank 0 could not read key {ref!r}: {exc}"}
    dist.broadcast_object_list(box, src=0)
    return box[0], got, failure


def _broadcast_into(torch: Any, dist: Any, t: Any) -> None:
    """Broadcast one tensor from rank 0 into ``t`` as raw bytes."""
    if t.numel() == 0:
        return
    buf = t.detach() if t.is_contiguous() else t.detach().contiguous()
    dist.broadcast(buf.reshape(-1).view(torch.uint8), src=0)
    if buf.data_ptr() != t.data_ptr():
        t.copy_(buf)
