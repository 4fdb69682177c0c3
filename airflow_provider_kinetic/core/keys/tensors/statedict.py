"""Tensors and state dicts as keys: ``store.put(key, state_dict)`` and
``store.get(key, dest=state_dict)``, filled in place.

Why safetensors in ONE file: the file then goes through the ordinary key path
(``KeyStore.put``), so it is content-hashed like any file and an unchanged state dict
hashes to the same version (no upload, no new version), and ``get`` verifies it like
any file.  safetensors writes tensors in a fixed order with a JSON header, so the same
tensors give the same bytes, and the header can be read (names, dtypes, shapes)
without reading the data: every check runs before any dest tensor is touched.

Why in place: a training or serving process pre-allocates its tensors (often on an
accelerator, often shared with a model); ``get`` copies the data into those same
objects instead of handing back new ones.

torch and safetensors are an optional extra (``tensors``): they are imported only
inside functions here, when a tensor is actually put or got.  ``is_tensors`` decides
whether an argument is a tensor without importing torch (a process that never
imported torch cannot hold a tensor).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core.data.hashing.statcache import StatCache
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.keys import fetch
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError

#: The one file a tensor key holds (a fixed name: the name is part of the hash).
FILE_NAME = "tensors.safetensors"
#: The safetensors metadata entry saying what was put: one tensor or a state dict.
KIND_META = "kinetic.kind"
#: The name a single tensor is stored under.
TENSOR_NAME = "tensor"
#: safetensors' dtype codes -> torch dtype attribute names.
_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
EXTRA_HINT = "install the provider's 'tensors' extra (torch and safetensors)"


class TensorMismatch(KineticError, ValueError):
    """dest does not have the stored tensors' names, shapes or dtypes (nothing was
    modified)."""


class TensorsMissing(KineticError, ImportError):
    """torch or safetensors is not installed."""


def is_tensors(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor or a mapping holding one (no torch import)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(obj, torch.Tensor):
        return True
    return isinstance(obj, Mapping) and any(isinstance(v, torch.Tensor) for v in obj.values())


def _safetensors_torch() -> Any:
    try:
        import safetensors.torch
    except ImportError as exc:
        raise TensorsMissing(f"tensors as keys need safetensors: {EXTRA_HINT}") from exc
    return safetensors.torch


def as_named(obj: Any, what: str) -> tuple[str, dict[str, Any]]:
    """``(kind, {name: tensor})`` for a tensor or a flat state dict; anything else in a
    state dict is refused, naming the entry."""
    import torch

    if isinstance(obj, torch.Tensor):
        return TENSOR_NAME, {TENSOR_NAME: obj}
    named: dict[str, Any] = {}
    for name, value in obj.items():
        if not isinstance(name, str) or not name:
            raise KeyNameError(f"{what}: state dict entry {name!r} is not a non-empty string name")
        if not isinstance(value, torch.Tensor):
            raise KeyNameError(
                f"{what}: state dict entry {name!r} is a {type(value).__name__}, not a tensor "
                "(only flat {name: tensor} state dicts are stored as tensors)"
            )
        named[name] = value
    return "state_dict", named


def write_file(obj: Any, path: str, what: str) -> None:
    """Write ``obj`` as safetensors to ``path`` (CPU copies; tensors that share storage,
    like tied weights, are stored as separate tensors)."""
    st = _safetensors_torch()
    kind, named = as_named(obj, what)
    cpu: dict[str, Any] = {}
    seen: set[tuple[int, int]] = set()
    for name in sorted(named):
        t = named[name].detach().to("cpu").contiguous()
        span = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        cpu[name] = t.clone() if span in seen else t
        seen.add(span)
    st.save_file(cpu, path, metadata={KIND_META: kind})


def read_header(path: str) -> dict[str, Any]:
    """``{"kind", "tensors": {name: [dtype code, shape]}}`` from a safetensors file's
    header alone (no tensor data is read)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        body = json.loads(f.read(size))
    meta = body.pop("__metadata__", None) or {}
    tensors = {name: [v["dtype"], list(v["shape"])] for name, v in body.items()}
    return {"kind": meta.get(KIND_META, "state_dict"), "tensors": tensors}


def dtype_name(code: str) -> str:
    return f"torch.{_DTYPES.get(code, code)}"


def check_dest(header: dict[str, Any], dest: Any, key: str) -> str | None:
    """Why ``dest`` cannot take the stored tensors (None: it can).  Every name, dtype
    and shape is compared; the message names the tensor, both sides and the key."""
    kind, named = as_named(dest, f"get {key!r} dest")
    stored = header["tensors"]
    if kind != header["kind"]:
        held = "one tensor" if header["kind"] == TENSOR_NAME else f"{len(stored)} tensors"
        given = "one tensor" if kind == TENSOR_NAME else f"a state dict of {len(named)}"
        return f"key {key!r} holds {held} ({header['kind']}) but dest is {given}"
    missing = sorted(set(stored) - set(named))
    extra = sorted(set(named) - set(stored))
    if missing or extra:
        return (
            f"key {key!r}: dest's tensor names differ from the stored ones: "
            f"missing in dest {missing[:10]}, not in the key {extra[:10]}"
        )
    for name in sorted(stored):
        code, shape = stored[name]
        t = named[name]
        want = dtype_name(code)
        if str(t.dtype) != want or list(t.shape) != shape:
            return (
                f"key {key!r}: tensor {name!r} is stored as {want} {tuple(shape)} but dest has "
                f"{t.dtype} {tuple(t.shape)}"
            )
    return None


def fill(path: str, dest: Any) -> None:
    """Copy the file's tensors into ``dest``'s tensors (checked before), one at a time
    (only one tensor's CPU copy is held at once)."""
    import torch

    st_open = _safe_open()
    _, named = as_named(dest, "dest")
    with torch.no_grad(), st_open(path, framework="pt", device="cpu") as f:
        for name in sorted(named):
            named[name].copy_(f.get_tensor(name))


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError as exc:
        raise TensorsMissing(f"tensors as keys need safetensors: {EXTRA_HINT}") from exc
    return safe_open


def put(keys: KeyStore, key: str, obj: Any, *, ttl: object = None) -> dict[str, Any]:
    """Store ``obj`` (a tensor or a state dict) under ``key`` as one safetensors file."""
    tmp = tempfile.mkdtemp(prefix="kinetic-tensors-")
    try:
        path = os.path.join(tmp, FILE_NAME)
        write_file(obj, path, f"put {key!r}")
        row = keys.put(key, path, ttl=ttl)
        _forget_stat_record(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row["tensors"] = True
    return row


def _forget_stat_record(path: str) -> None:
    """Drop the stat cache's record of the staging file: it names a temporary path
    that is never hashed again, and would only push a useful record (a dataset's
    tree) out of the cache's least-recently-used window."""
    cache = StatCache.default()
    if cache is not None:
        with contextlib.suppress(OSError):
            os.unlink(cache.path_for(path, os.stat(path).st_dev))


class Fetched:
    """A tensor key's file, fetched and verified into a temporary directory (removed
    by ``close``): the broadcast's rank 0 reads it the same way a plain get does."""

    def __init__(self, keys: KeyStore, ref: str, version: str | None) -> None:
        self.dir = tempfile.mkdtemp(prefix="kinetic-tensors-")
        try:
            self.row = fetch.get(keys, ref, os.path.join(self.dir, "got"), version)
            self.path = self.row["dest"]
            if not os.path.isfile(self.path):
                raise TensorMismatch(
                    f"key {ref!r} holds a {self.row['kind']}, not tensors: get it into a path"
                )
            self.header = read_header(self.path)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def get(keys: KeyStore, ref: str, dest: Any, version: str | None = None) -> dict[str, Any]:
    """Fill ``dest`` (a tensor or a state dict) in place with the key's tensors."""
    got = Fetched(keys, ref, version)
    try:
        problem = check_dest(got.header, dest, ref)
        if problem:
            raise TensorMismatch(problem + "; nothing was modified")
        fill(got.path, dest)
    finally:
        got.close()
    row = {k: v for k, v in got.row.items() if k != "dest"}
    row.update({"tensors": len(got.header["tensors"]), "source": "store"})
    return row
