"""A tree manifest: the files of one content hash and the object holding each.

The incremental layout stores each distinct file content once, as
``default/data-files/{sha256 of its bytes}``; a tree (one kinetic content hash) is
``default/data-trees/{hash}.json``, listing every file in kinetic's hash order with
its size and the SHA-256 of its bytes.  The manifest is what a job's ref names on a
bucket, what ``data gc`` reads to know which file objects are still named (held),
and what the runner assembles the tree from; the tree is then checked against
kinetic's content hash as any cache entry is.  Stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FORMAT = 1


class ManifestError(ValueError):
    """A manifest that is not one (bad JSON, a bad field): never assembled."""


@dataclass(frozen=True)
class ManifestFile:
    """One file of the tree: its path in it, its size, the SHA-256 of its bytes."""

    rel: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    content_hash: str
    is_dir: bool
    files: tuple[ManifestFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def shas(self) -> set[str]:
        return {f.sha256 for f in self.files}

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "content_hash": self.content_hash,
                "is_dir": self.is_dir,
                "files": [[f.rel, f.size, f.sha256] for f in self.files],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, name: str) -> Manifest:
        """Parse a manifest; ``ManifestError`` naming ``name`` when it is not one."""
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            files = tuple(
                ManifestFile(str(rel), int(size), _sha(sha)) for rel, size, sha in doc["files"]
            )
            for f in files:
                parts = f.rel.split("/")
                if f.rel.startswith("/") or ".." in parts or "" in parts or f.size < 0:
                    raise ValueError(f"bad file entry {f.rel!r}")
            return cls(_sha(doc["content_hash"]), bool(doc["is_dir"]), files)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ManifestError(f"data manifest {name} is not valid: {exc}") from exc


def _sha(value: object) -> str:
    text = str(value)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{value!r} is not a SHA-256 hex digest")
    return text
