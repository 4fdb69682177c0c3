"""Tensors as keys (``core/keys/tensors/``): put as safetensors, get in place, the
checks before anything is modified, and the ``torch.distributed`` broadcast among a
batch's children (gloo among 4 real local children; the rendezvous on both stores).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from airflow_provider_kinetic import BroadcastWindow  # noqa: E402
from airflow_provider_kinetic.core.backends.local.backend import LocalBackend  # noqa: E402
from airflow_provider_kinetic.core.batch import launch as batchlaunch  # noqa: E402
from airflow_provider_kinetic.core.batch import outcomes as batchoutcomes  # noqa: E402
from airflow_provider_kinetic.core.batch.plan import plan_batch  # noqa: E402
from airflow_provider_kinetic.core.config import KineticConfig  # noqa: E402
from airflow_provider_kinetic.core.data.hashing import statrecord  # noqa: E402
from airflow_provider_kinetic.core.jobs.request import JobRequest  # noqa: E402
from airflow_provider_kinetic.core.keys.keystore import KeyStore  # noqa: E402
from airflow_provider_kinetic.core.keys.names import KeyNameError  # noqa: E402
from airflow_provider_kinetic.core.keys.peer.registry import PEERS_PREFIX  # noqa: E402
from airflow_provider_kinetic.core.keys.tensors import statedict as tensors  # noqa: E402
from airflow_provider_kinetic.core.keys.tensors.statedict import TensorMismatch  # noqa: E402
from airflow_provider_kinetic.core.storage import LocalStore, ObjectStore  # noqa: E402
from tests.fixtures.batch_drive import drive  # noqa: E402
from tests.fixtures.fake_gcs import requires_fake_gcs  # noqa: E402

REPO = Path(__file__).resolve().parents[5]


@pytest.fixture(autouse=True)
def _own_stat_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "statcache"))


def checksum(named: dict[str, Any]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes (any dtype)."""
    h = hashlib.sha256()
    for name in sorted(named):
        t = named[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.randn(64, 32, generator=g),
        "layer.bias": torch.randn(64, generator=g).to(torch.bfloat16),
        "steps": torch.tensor(1000 + seed, dtype=torch.int64),
        "mask": torch.rand(7, generator=g) > 0.5,
        "proj": torch.randn(8, 32, generator=g),
    }


def empty_like(sd: dict[str, Any]) -> dict[str, Any]:
    """Pre-allocated dest; ``proj`` is a non-contiguous view (a transposed buffer)."""
    dest = {k: torch.zeros_like(v) for k, v in sd.items()}
    dest["proj"] = torch.zeros(32, 8).t()
    return dest


def test_put_stores_safetensors_and_get_fills_in_place(store: ObjectStore, tmp_path: Path) -> None:
    keys = KeyStore(store)
    sd = model_state()
    first = tensors.put(keys, "models/tiny", sd)
    assert first["uploaded"] is True and first["files"] == 1 and first["kind"] == "file"
    # An unchanged state dict: same version, nothing uploaded, no new version or object.
    before = store.list("")
    again = tensors.put(keys, "models/tiny", model_state())
    assert (again["uploaded"], again["version"]) == (False, first["version"])
    assert store.list("") == before
    state = keys.state("models/tiny")
    assert state is not None and len(state.versions) == 1

    dest = empty_like(sd)
    ids = {k: id(v) for k, v in dest.items()}
    row = tensors.get(keys, "models/tiny", dest)
    assert row["version"] == first["version"] and row["tensors"] == len(sd)
    assert {k: id(v) for k, v in dest.items()} == ids  # the same objects, filled
    assert not dest["proj"].is_contiguous() and checksum(dest) == checksum(sd)

    one = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    tensors.put(keys, "models/one", one)
    into = torch.empty(3, 4, dtype=torch.float16)
    tensors.get(keys, "models/one", into)
    assert torch.equal(into, one)
    assert [p for p in store.list("") if "kinetic-tensors" in p] == []
    # The staging files' stat-cache records are dropped (they would only evict others);
    # what stays is the record of a cache entry the unchanged put verified in place.
    roots = [statrecord.decode(p.read_bytes()).root for p in (tmp_path / "statcache").glob("*")]
    assert [r for r in roots if "kinetic-tensors-" in r] == []
    assert all("data-cache" in r for r in roots), roots


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda d: d.__setitem__("layer.weight", torch.zeros(32, 64)),
            r"key 'm/x': tensor 'layer.weight' is stored as torch.float32 \(64, 32\) "
            r"but dest has torch.float32 \(32, 64\)",
        ),
        (
            lambda d: d.__setitem__("layer.bias", torch.zeros(64)),
            r"tensor 'layer.bias' is stored as torch.bfloat16 \(64,\) but dest has "
            r"torch.float32 \(64,\)",
        ),
        (lambda d: d.pop("mask"), r"missing in dest \['mask'\], not in the key \[\]"),
        (
            lambda d: d.__setitem__("extra", torch.zeros(1)),
            r"missing in dest \[\], not in the key \['extra'\]",
        ),
    ],
)
def test_mismatch_names_the_tensor_and_modifies_nothing(tmp_path: Path, change, match) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "bucket")))
    tensors.put(keys, "m/x", model_state())
    dest = {k: torch.full_like(v, 3) for k, v in model_state().items()}
    change(dest)
    before = {k: v.clone() for k, v in dest.items()}
    with pytest.raises(TensorMismatch, match=match):
        tensors.get(keys, "m/x", dest)
    assert all(torch.equal(dest[k], before[k]) for k in before)


def test_kinds_and_bad_state_dicts_are_refused(tmp_path: Path) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "bucket")))
    tensors.put(keys, "m/one", torch.zeros(3))
    with pytest.raises(TensorMismatch, match=r"key 'm/one' holds one tensor"):
        tensors.get(keys, "m/one", {"tensor": torch.zeros(3), "b": torch.zeros(1)})
    with pytest.raises(KeyNameError, match=r"entry 'lr' is a float, not a tensor"):
        tensors.put(keys, "m/opt", {"w": torch.zeros(1), "lr": 0.1})
    assert keys.state("m/opt") is None


def test_tied_weights_are_stored_and_restored(tmp_path: Path) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "bucket")))
    shared = torch.randn(4, 4)
    tensors.put(keys, "m/tied", {"embed": shared, "head": shared})
    dest = {"embed": torch.zeros(4, 4), "head": torch.zeros(4, 4)}
    tensors.get(keys, "m/tied", dest)
    assert torch.equal(dest["embed"], shared) and torch.equal(dest["head"], shared)


# ---- broadcast among a batch's children ----------------------------------------------
def receive(
    index: int, key: str, world: int, bad_index: int, group: str | None = None
) -> dict[str, Any]:
    """A batch child: count its reads of the key's blob, get by broadcast, checksum."""
    import os

    import torch

    from airflow_provider_kinetic import BroadcastWindow, store
    from airflow_provider_kinetic.core.storage import LocalStore

    reads: list[str] = []
    real = LocalStore.download_prefix

    def counting(self, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(prefix)
        return real(self, prefix, *args, **kwargs)

    LocalStore.download_prefix = counting  # type: ignore[method-assign]
    dest = empty_like(model_state())
    if index == bad_index:
        dest["proj"] = torch.zeros(9, 32)
    ids = {k: id(v) for k, v in dest.items()}
    before = checksum(dest)
    scope = os.environ.get("KINETIC_PEER_SCOPE")
    try:
        window = BroadcastWindow(world_size=world, timeout=120, group_id=group)
        row = store.get(key, dest=dest, broadcast=window)
    except Exception as exc:  # noqa: BLE001 - the test asserts what every child saw
        error = f"{type(exc).__name__}: {exc}"
        return {"error": error, "untouched": checksum(dest) == before, "scope": scope}
    return {
        "scope": scope,
        "rank": row["rank"],
        "source": row["source"],
        "backend": row["backend"],
        "version": row["version"],
        "blob_reads": [p for p in reads if "data-cache" in p],
        "checksum": checksum(dest),
        "same_objects": ids == {k: id(v) for k, v in dest.items()},
    }


def _run_batch(tmp_path: Path, store: LocalStore, inputs: list[list[Any]]) -> list[Any]:
    config = KineticConfig(backend="local", root=store.bucket)
    backend = LocalBackend(store.bucket)
    request = JobRequest(func=receive, output_dir=store.uri("outputs/bcast"))
    state, objects, local = plan_batch(
        request,
        inputs,
        "args",
        store,
        config=config,
        max_concurrent=len(inputs),
        retries=0,
        fail_fast=False,
    )
    batchlaunch.start_batch(state, objects, local, store)

    drive(state, config, backend, store)  # as the batch's sensor would
    values, failures = batchoutcomes.gather(state, store)
    assert failures == {}, failures
    # Every child met in its batch's peer scope, and the rendezvous records on the
    # scope's registry board are gone once the group formed.
    assert {v["scope"] for v in values} == {state.group_id}
    assert store.list(f"{PEERS_PREFIX}/{state.group_id}/") == []
    return values


def test_tensor_broadcast_gloo_among_4_local_children(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    sd = model_state(seed=4)
    put = tensors.put(KeyStore(store), "models/bcast", sd)
    values = _run_batch(tmp_path, store, [[i, "models/bcast", 4, -1] for i in range(4)])
    assert sorted(v["rank"] for v in values) == [0, 1, 2, 3]
    assert {v["checksum"] for v in values} == {checksum(sd)}
    assert all(v["same_objects"] and v["version"] == put["version"] for v in values)
    assert {v["backend"] for v in values} == {"gloo"}
    # Exactly one child read the key's blob from the store: rank 0.
    readers = [v for v in values if v["blob_reads"]]
    assert len(readers) == 1 and len(readers[0]["blob_reads"]) == 1
    assert readers[0]["rank"] == 0 and readers[0]["source"] == "store"
    assert sorted(v["source"] for v in values) == ["peer", "peer", "peer", "store"]


def test_a_mismatch_or_a_failed_read_fails_every_peer_before_any_dest_is_modified(
    tmp_path: Path,
) -> None:
    """One batch, two broadcasts told apart by group_id: children 0-1 get a key into
    dests where child 1's has a wrong shape; children 2-3 get a key that does not
    exist (rank 0's read fails)."""
    store = LocalStore(str(tmp_path / "bucket"))
    tensors.put(KeyStore(store), "models/bcast", model_state())
    inputs = [[i, "models/bcast", 2, 1, "shape"] for i in range(2)]
    inputs += [[i, "models/absent", 2, -1, "absent"] for i in range(2, 4)]
    values = _run_batch(tmp_path, store, inputs)
    assert all(v["untouched"] for v in values), values
    shape, absent = [v["error"] for v in values[:2]], [v["error"] for v in values[2:]]
    assert all(e.startswith("TensorMismatch") for e in shape), shape
    assert all("tensor 'proj' is stored as torch.float32 (8, 32) but dest has" in e for e in shape)
    assert all("(9, 32)" in e and "'models/bcast'" in e for e in shape)
    # Rank 0 raises the store's own error; its peer is told why.
    assert sorted(e.split(":")[0] for e in absent) == ["KeyNotFound", "PeerReadError"], absent
    assert all("no key 'models/absent'" in e for e in absent), absent


# ---- the same broadcast on a bucket (fake-gcs-server), peers as real subprocesses ----
PEER = """
import json, os, sys, torch
sys.path.insert(0, os.environ["REPO"])
from tests.integration.core.keys.tensors.test_tensor_keys import checksum, model_state
from airflow_provider_kinetic import BroadcastWindow, store
dest = {k: torch.zeros_like(v) for k, v in model_state().items()}
window = BroadcastWindow(world_size=int(os.environ["WORLD"]), timeout=90)
row = store.get(os.environ["KEY"], dest=dest, broadcast=window)
print(json.dumps({"rank": row["rank"], "source": row["source"], "sum": checksum(dest)}))
"""


@requires_fake_gcs
@pytest.mark.usefixtures("fake_gcs")
def test_tensor_broadcast_rendezvous_on_a_bucket(gcs_bucket: str, tmp_path: Path) -> None:
    from airflow_provider_kinetic.core.storage.gcs import GcsStore

    store = GcsStore(gcs_bucket)
    sd = model_state(seed=7)
    tensors.put(KeyStore(store), "models/gcs", sd)
    env = {**os.environ, "REPO": str(REPO), "KEY": "models/gcs", "JOB_ID": "job-peer", "WORLD": "2"}
    env.update(GCS_BUCKET=gcs_bucket, KINETIC_PEER_SCOPE="grp-gcstest")
    env["KINETIC_STATCACHE_DIR"] = str(tmp_path / "statcache")
    procs = [
        subprocess.Popen([sys.executable, "-c", PEER], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert {r["sum"] for r in rows} == {checksum(sd)}
    assert sorted(r["source"] for r in rows) == ["peer", "store"]
    assert store.list(f"{PEERS_PREFIX}/grp-gcstest/") == []


def run_peers(script: str, env: dict[str, str], n: int) -> list[tuple[int, str, str]]:
    """``n`` peer processes; (returncode, stdout, stderr) of each, all reaped."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_peers_that_cannot_reach_rank_0_each_read_the_store(tmp_path: Path) -> None:
    """A network policy between pods: rank 0 advertises an address nobody reaches
    (TEST-NET-2), so rank 1 cannot connect; no group is made, both read the store,
    one warning says why, and the registry board is cleaned."""
    store = LocalStore(str(tmp_path / "bucket"))
    sd = model_state(seed=5)
    tensors.put(KeyStore(store), "models/blocked", sd)
    env = {**os.environ, "REPO": str(REPO), "KEY": "models/blocked", "WORLD": "2"}
    env.update(JOB_ID="job-blocked", GCS_BUCKET=store.bucket, KINETIC_PEER_SCOPE="grp-blocked")
    env.update(KINETIC_PEER_ADDRESS="198.51.100.1", KINETIC_PEER_CONNECT_S="1")
    env["KINETIC_STATCACHE_DIR"] = str(tmp_path / "statcache")
    script = PEER.replace('"sum": checksum(dest)', '"sum": checksum(dest), "fb": row["fallback"]')
    done = run_peers(script, env, 2)
    assert [rc for rc, _, _ in done] == [0, 0], done
    rows = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in done]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert [(r["source"], r["fb"], r["sum"]) for r in rows] == [("store", True, checksum(sd))] * 2
    warned = [err for _, _, err in done if "cannot be reached" in err]
    assert len(warned) == 1 and "198.51.100.1" in warned[0], [err for _, _, err in done]
    assert store.list(f"{PEERS_PREFIX}/grp-blocked/") == []


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="NCCL broadcast needs 2 CUDA devices (no GPU machine was lent when this was "
    "written; run it where one is)",
)
def test_tensor_broadcast_nccl_between_two_gpus(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "bucket"))
    sd = model_state(seed=9)
    tensors.put(KeyStore(store), "models/gpu", sd)
    script = PEER.replace(
        "dest = {k: torch.zeros_like(v) for k, v in model_state().items()}",
        "dev = torch.device('cuda', int(os.environ['DEV']))\n"
        "dest = {k: torch.zeros_like(v, device=dev) for k, v in model_state().items()}",
    )
    base = {**os.environ, "REPO": str(REPO), "KEY": "models/gpu", "JOB_ID": "job-gpu", "WORLD": "2"}
    base.update(GCS_BUCKET=store.bucket, KINETIC_PEER_SCOPE="grp-gpu")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], env={**base, "DEV": str(i)}, stdout=subprocess.PIPE
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    rows = [json.loads(o.decode().strip().splitlines()[-1]) for o in outs]
    assert {r["sum"] for r in rows} == {checksum(sd)}


def test_public_store_puts_and_gets_tensors_inside_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kinetic import store

    monkeypatch.setenv("JOB_ID", "job-tensors")
    monkeypatch.setenv("GCS_BUCKET", str(tmp_path / "bucket"))
    sd = model_state(seed=3)
    row = store.put("models/public", sd)
    assert row["tensors"] is True and row["by"]["job_id"] == "job-tensors"
    dest = empty_like(sd)
    got = store.get("models/public", dest=dest)
    assert got["version"] == row["version"] and checksum(dest) == checksum(sd)
    one = torch.zeros(3)
    alone = store.get("models/public", dest=dest, broadcast=BroadcastWindow(world_size=1))
    assert alone["rank"] == 0 and alone["source"] == "store"
    with pytest.raises(TensorMismatch, match="holds 5 tensors"):
        store.get("models/public", dest=one)
