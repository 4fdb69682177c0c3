"""Trust boundaries (issue 38, case 1): a LocalStore read never leaves the store root.

A job's output dir is a directory of the store, so a job can leave symlinks in it.
Every read (read_bytes, download_file, download_prefix, stat, exists, list, the swap
read, stat_objects) resolves links: what leads outside is refused naming the key, or
not listed; a link to a file inside the root is served as that file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.storage import LocalStore, ObjectNotFound, OutsideStoreError
from airflow_provider_kinetic.core.storage.stat import stat_objects
from airflow_provider_kinetic.core.storage.swap import read_versioned

SECRET = b"root:x:0:0:secret outside the store\n"


@pytest.fixture
def linked(tmp_path: Path) -> LocalStore:
    """A store whose job output dir holds: a plain file, a link to a file outside the
    root, a link to a directory outside, a link to a file inside, a dangling link out."""
    outside = tmp_path / "outside"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "passwd").write_bytes(SECRET)
    store = LocalStore(str(tmp_path / "store"))
    store.write_bytes("job-1/out/plain.txt", b"plain")
    store.write_bytes("job-1/result.txt", b"inside")
    out = tmp_path / "store" / "job-1" / "out"
    os.symlink(outside / "etc" / "passwd", out / "passwd")
    os.symlink(outside / "etc", out / "etc")
    os.symlink("../result.txt", out / "result-link.txt")
    os.symlink(outside / "not-yet", out / "dangling")
    return store


@pytest.mark.parametrize("key", ["job-1/out/passwd", "job-1/out/etc/passwd", "job-1/out/dangling"])
def test_a_link_out_of_the_root_is_refused_by_every_read(
    linked: LocalStore, tmp_path: Path, key: str
) -> None:
    reads = {
        "read_bytes": lambda: linked.read_bytes(key),
        "download_file": lambda: linked.download_file(key, str(tmp_path / "dl" / "f")),
        "stat": lambda: linked.stat(key),
        "exists": lambda: linked.exists(key),
        "read_versioned": lambda: read_versioned(linked, key),
    }
    for name, read in reads.items():
        with pytest.raises(OutsideStoreError, match="leads outside the store root") as info:
            read()
        assert repr(key) in str(info.value), name
    assert not (tmp_path / "dl" / "f").exists()


def test_listing_leaves_out_links_that_lead_outside(linked: LocalStore, tmp_path: Path) -> None:
    served = ["job-1/out/plain.txt", "job-1/out/result-link.txt"]
    assert linked.list("job-1/out/") == served
    assert linked.list("job-1/") == ["job-1/out/plain.txt", "job-1/out/result-link.txt",
                                     "job-1/result.txt"]  # fmt: skip
    assert linked.list("job-1/out/etc/") == []  # the prefix's own dir is a link out
    assert sorted(stat_objects(linked, "job-1/out/")) == served
    got = linked.download_prefix("job-1/out", str(tmp_path / "copy"))
    assert got == ["plain.txt", "result-link.txt"]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == got


def test_a_link_to_a_file_inside_the_root_is_served_as_that_file(
    linked: LocalStore, tmp_path: Path
) -> None:
    key = "job-1/out/result-link.txt"
    assert linked.exists(key)
    assert linked.read_bytes(key) == b"inside"
    assert linked.stat(key).st_size == len(b"inside")
    linked.download_file(key, str(tmp_path / "dl.txt"))
    assert (tmp_path / "dl.txt").read_bytes() == b"inside"
    assert read_versioned(linked, key)[0] == b"inside"


def test_a_root_reached_through_a_link_still_reads(tmp_path: Path) -> None:
    """The root itself may be a link (a mount, /tmp on some systems): containment is
    decided on real paths, so everything under it stays inside."""
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "via-link")
    store = LocalStore(str(tmp_path / "via-link"))
    store.write_bytes("a/b.txt", b"x")
    assert store.read_bytes("a/b.txt") == b"x"
    assert store.list("a/") == ["a/b.txt"]
    with pytest.raises(ObjectNotFound):
        store.read_bytes("a")  # a directory is not an object


def test_delete_prefix_removes_the_links_never_their_targets(
    linked: LocalStore, tmp_path: Path
) -> None:
    assert linked.delete_prefix("job-1") == 3  # the three objects; the links go too
    assert not (tmp_path / "store" / "job-1").exists()
    assert (tmp_path / "outside" / "etc" / "passwd").read_bytes() == SECRET
