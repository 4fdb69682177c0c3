"""One rule for ``file://`` URIs: built by percent-encoding the path (``quote``,
keeping ``/``), read by percent-decoding it, by the store, ``store_for_uri`` (the
runner), ``Data`` and the output dir a function sees; URIs an earlier version wrote
unencoded still read as the same path whenever they hold no ``%``."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.jobs.template import function_output_dir
from airflow_provider_kinetic.core.storage import LocalStore, store_for_uri

#: Names a store root or output dir may have: each breaks a naive URI another way.
AWKWARD = ["a b", "50%", "%41", "x%2Fy", "#frag", "q?x=1", "é ñ", "日本", "a+b;c=d"]


@pytest.mark.parametrize("name", AWKWARD)
def test_store_uri_data_runner_and_output_dir_name_the_same_path(tmp_path: Path, name) -> None:
    root = tmp_path / name / "store"
    store = LocalStore(str(root))
    store.write_bytes("outputs/job/model.json", b"{}")
    path = str(root / "outputs" / "job")
    uri = store.uri("outputs/job")
    assert uri == "file://" + urllib.parse.quote(path)  # percent-encoded, "/" kept
    assert not any(c in uri[len("file://") :] for c in " #?") and uri.isascii()
    assert Data(uri).local_path == path  # the Data a downstream task makes of it
    assert function_output_dir(uri) == path  # what the job writes in
    runner_store, key = store_for_uri(uri + "/model.json")  # what the runner reads
    assert runner_store.read_bytes(key) == b"{}"
    assert Data(uri).content_hash() == Data(path).content_hash()


def test_a_name_that_is_not_utf8_round_trips(tmp_path: Path) -> None:
    raw = os.fsdecode(b"caf\xe9 #1")  # a Latin-1 name: surrogate-escaped on a UTF-8 system
    root = tmp_path / raw
    store = LocalStore(str(root))
    store.write_bytes("k", b"v")
    uri = store.uri("k")
    assert uri.endswith("/caf%E9%20%231/k")
    runner_store, key = store_for_uri(uri)
    assert runner_store.read_bytes(key) == b"v"
    assert Data(store.uri()).local_path == str(root)


def test_uris_an_earlier_version_wrote_unencoded_still_read(tmp_path: Path) -> None:
    """Earlier versions wrote ``file://`` + the raw path: with no ``%`` in it, it
    decodes to itself, ``#`` and ``?`` included (never a fragment or a query)."""
    out = tmp_path / "old out #1 ?v é"
    out.mkdir()
    (out / "m.json").write_text("{}")
    legacy = "file://" + str(out)
    assert Data(legacy).local_path == str(out)
    assert Data(legacy + "/").is_dir
    assert Data(legacy).content_hash() == Data(str(out)).content_hash()
    assert function_output_dir(legacy) == str(out)
    store, key = store_for_uri(legacy + "/m.json")
    assert store.read_bytes(key) == b"{}"
    assert Data("file://localhost" + str(out)).local_path == str(out)


@pytest.mark.parametrize("uri", ["file://host/x", "file://relative", "file://localhost"])
def test_a_host_or_a_relative_path_is_refused_by_both_readers(uri) -> None:
    with pytest.raises(ValueError, match="must be file:///absolute/path"):
        Data(uri).validate()
    with pytest.raises(ValueError, match="must be file:///absolute/path"):
        store_for_uri(uri)
