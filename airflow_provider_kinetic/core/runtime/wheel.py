"""A wheel of this package, made from the files that are running right now.

A job image needs this package (batch children run ``python -m
airflow_provider_kinetic.runner``), installed with ``--no-deps`` so Airflow stays
out of the image.  Building it from the imported package's own files (not from a
source checkout) works the same for an editable install and for a wheel install,
and its bytes depend only on those files: same code, same wheel, same image tag.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zipfile

from airflow_provider_kinetic.core.version import __version__

PACKAGE = "airflow_provider_kinetic"
#: The package directory these files run from (this module is core/runtime/wheel.py).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: A fixed timestamp: identical files give an identical wheel.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def package_version() -> str:
    return __version__


def wheel_name() -> str:
    """The wheel's file name (a valid one: installers parse it)."""
    return f"{PACKAGE}-{package_version()}-py3-none-any.whl"


def package_files() -> list[tuple[str, bytes]]:
    """(archive path, bytes) of every source file of the package, sorted."""
    root = PACKAGE_DIR
    out = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in files:
            # Compiled extensions are this machine's; the wheel is py3-none-any (the
            # pod needs none of them: the package works without its extension).
            if name.endswith((".pyc", ".pyo", ".so", ".pyd")) or name.startswith("."):
                continue
            path = os.path.join(here, name)
            rel = os.path.relpath(path, os.path.dirname(root)).replace(os.sep, "/")
            with open(path, "rb") as f:
                out.append((rel, f.read()))
    return sorted(out)


def package_sha256() -> str:
    """One hash over the package's files (names and bytes): part of the image tag."""
    digest = hashlib.sha256()
    for rel, data in package_files():
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + raw.decode()


def build_wheel() -> bytes:
    """The wheel's bytes (pure Python, no dependencies declared: see module doc)."""
    info = f"{PACKAGE}-{package_version()}.dist-info"
    files = package_files()
    files.append(
        (
            f"{info}/METADATA",
            (
                "Metadata-Version: 2.1\n"
                "Name: airflow-provider-kinetic\n"
                f"Version: {package_version()}\n"
                "Summary: kinetic job runner (image build of airflow-provider-kinetic)\n"
            ).encode(),
        )
    )
    files.append(
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: airflow-provider-kinetic\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    record = "".join(f"{rel},{_record_hash(data)},{len(data)}\n" for rel, data in files)
    files.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files:
            entry = zipfile.ZipInfo(rel, date_time=_EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    return buf.getvalue()
