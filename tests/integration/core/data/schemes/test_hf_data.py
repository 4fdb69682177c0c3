"""hf:// data: URI parsing and loading through the real datasets client, against the
loopback Hugging Face Hub double (``tests/fixtures/hf_hub_double.py``)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import datasets
import pytest

from airflow_provider_kinetic.core.data.schemes.hf_load import (
    HfSource,
    load_hf_to_disk,
    parse_hf_uri,
)

PARQUET = "data/{split}-00000-of-00001.parquet"
REPO_ROOT = Path(__file__).resolve().parents[5]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("hf://org/name", HfSource("org/name")),
        ("hf://imdb?split=train", HfSource("imdb", split="train")),
        ("hf://org/name/", HfSource("org/name")),
        (
            "hf://org/my-set_1.0?split=train[:10]&config_name=x&revision=refs%2Fpr%2F1",
            HfSource("org/my-set_1.0", "train[:10]", "x", "refs/pr/1"),
        ),
        ("hf://org/name?split=train+test", HfSource("org/name", split="train+test")),
    ],
)
def test_parse_hf_uri(uri: str, expected: HfSource) -> None:
    assert parse_hf_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/data", "'gs://bucket/data' is not an hf:// URI"),
        ("HF://org/name", "is not an hf:// URI"),
        ("hf://", "names no dataset repo"),
        ("hf://?split=train", "names no dataset repo"),
        ("hf://a/b/c", "bad dataset repo 'a/b/c'"),
        ("hf://org//name", "bad dataset repo 'org//name'"),
        ("hf://../etc", "bad dataset repo '../etc'"),
        ("hf://org/name?splits=train", "unknown query key 'splits'; allowed: split, config_name"),
        ("hf://org/name?train", "unknown query key 'train'"),
        ("hf://org/name?split=", "query key 'split' has an empty value"),
        ("hf://org/name?split=a&split=b", "query key 'split' given twice"),
        ("hf://org/name#v2", "unexpected #fragment 'v2'"),
    ],
)
def test_parse_hf_uri_rejects(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_hf_uri(uri)


def test_split_loads_one_dataset(hf_hub, tmp_path: Path) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1, 2, 3]}, "test": {"x": [9]}})

    out = load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "out"))

    assert out == str(tmp_path / "out")
    ds = datasets.load_from_disk(out)
    assert isinstance(ds, datasets.Dataset)
    assert ds["x"] == [1, 2, 3]
    fetched = [r.path for r in hf_hub.requests if r.method == "GET"]
    assert any(p.endswith(PARQUET.format(split="train")) for p in fetched), fetched
    assert hf_hub.unhandled == []  # the double serves every endpoint the client used


def test_no_split_loads_all_splits(hf_hub, tmp_path: Path) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1, 2]}, "test": {"x": [3]}})

    ds = datasets.load_from_disk(load_hf_to_disk("hf://org/name", str(tmp_path / "out")))

    assert isinstance(ds, datasets.DatasetDict)
    assert {k: v["x"] for k, v in ds.items()} == {"train": [1, 2], "test": [3]}


def test_legacy_one_segment_name_follows_the_hub_redirect(hf_hub, tmp_path: Path) -> None:
    # The hub moved "imdb" & co to "org/name" repos and redirects the old names; the
    # datasets client itself cannot load them any more (huggingface/datasets#8612).
    hf_hub.add_dataset("stanfordnlp/imdb", {"train": {"x": [4]}})
    hf_hub.add_alias("imdb", "stanfordnlp/imdb")

    out = load_hf_to_disk("hf://imdb?split=train", str(tmp_path / "out"))

    assert datasets.load_from_disk(out)["x"] == [4]
    assert hf_hub.requests[0].path == "/api/datasets/imdb"


def test_config_name_selects_a_config(hf_hub, tmp_path: Path) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1]}})
    hf_hub.add_dataset("org/name", {"train": {"y": ["a", "b"]}}, config_name="extra")

    extra = load_hf_to_disk("hf://org/name?config_name=extra&split=train", str(tmp_path / "e"))
    default = load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "d"))

    assert datasets.load_from_disk(extra).to_dict() == {"y": ["a", "b"]}
    assert datasets.load_from_disk(default).to_dict() == {"x": [1]}


def test_revision_is_passed_to_the_hub(hf_hub, tmp_path: Path) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1]}})
    v1_sha = hf_hub.add_dataset("org/name", {"train": {"x": [42]}}, revision="v1")

    out = load_hf_to_disk("hf://org/name?split=train&revision=v1", str(tmp_path / "out"))

    assert datasets.load_from_disk(out)["x"] == [42]
    paths = [r.path for r in hf_hub.requests]
    assert any("/resolve/v1/" in p or p.endswith("/revision/v1") for p in paths), paths
    assert f"/datasets/org/name/resolve/{v1_sha}/{PARQUET.format(split='train')}" in paths


def test_local_directory_named_like_the_repo_does_not_shadow_the_hub(
    hf_hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1, 2]}})
    local = tmp_path / "cwd" / "org" / "name"
    local.mkdir(parents=True)
    (local / "train.csv").write_text("x\n100\n")
    monkeypatch.chdir(tmp_path / "cwd")
    # The trap is real: a plain load_dataset from here reads the local directory.
    shadowed = datasets.load_dataset("org/name", split="train", cache_dir=str(tmp_path / "c"))
    assert shadowed["x"] == [100]

    out = load_hf_to_disk("hf://org/name?split=train", "out")  # relative to the caller's cwd

    assert out == str(tmp_path / "cwd" / "out")
    assert datasets.load_from_disk(out)["x"] == [1, 2]
    assert Path.cwd() == tmp_path / "cwd"


def test_temporary_cache_is_removed(
    hf_hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [1]}})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "out"))
    assert any(r.path.endswith(".parquet") for r in hf_hub.requests)
    assert list(scratch.iterdir()) == []
    # ... nor does a copy stay in huggingface_hub's own cache (~/.cache/huggingface/hub).
    assert list(hf_hub.home.rglob("*.parquet")) == []

    with pytest.raises(datasets.exceptions.DatasetNotFoundError, match="org/missing"):
        load_hf_to_disk("hf://org/missing?split=train", str(tmp_path / "out2"))
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "out2").exists()


def test_trust_remote_code_is_ignored_with_a_warning_by_script_free_datasets(
    hf_hub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [7]}})
    caplog.set_level(logging.WARNING, logger="airflow_provider_kinetic.core.data.schemes.hf_load")

    out = load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "out"), True)

    assert datasets.load_from_disk(out)["x"] == [7]
    assert "has no effect" in caplog.text
    assert "may run" not in caplog.text
    assert f"datasets {datasets.__version__}" in caplog.text


def test_trust_remote_code_is_passed_to_datasets_that_take_it(
    hf_hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [8]}})
    real_load, seen = datasets.load_dataset, []

    def load_dataset(path, *, trust_remote_code=False, **kwargs):  # datasets < 4's signature
        seen.append(trust_remote_code)
        return real_load(path, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "a"), True)
    load_hf_to_disk("hf://org/name?split=train", str(tmp_path / "b"))

    assert seen == [True, False]


def test_the_double_answers_listing_calls(hf_hub) -> None:
    from huggingface_hub import HfApi, HfFileSystem

    hf_hub.add_dataset("org/name", {"train": {"x": [1]}})
    sha = hf_hub.add_dataset("org/name", {"train": {"y": [2]}}, config_name="extra")
    api = HfApi()  # the default endpoint, from the environment

    assert api.dataset_info("org/name").sha == sha
    assert sorted(api.list_repo_files("org/name", repo_type="dataset")) == [
        "README.md",
        "data/train-00000-of-00001.parquet",
        "extra/train-00000-of-00001.parquet",
    ]
    info = api.get_paths_info("org/name", ["extra", "README.md", "nope"], repo_type="dataset")
    assert sorted((type(i).__name__, i.path) for i in info) == [
        ("RepoFile", "README.md"),
        ("RepoFolder", "extra"),
    ]
    assert HfFileSystem().glob("datasets/org/name/*/train-*.parquet") == [
        "datasets/org/name/data/train-00000-of-00001.parquet",
        "datasets/org/name/extra/train-00000-of-00001.parquet",
    ]
    assert hf_hub.unhandled == []


def _run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )


def test_subprocess_reaches_the_double_through_its_environment(hf_hub, tmp_path: Path) -> None:
    hf_hub.add_dataset("org/name", {"train": {"x": [5, 6]}})
    target = tmp_path / "out"
    # A child started with a clean environment plus hf_hub.env reaches the double.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **hf_hub.env}
    code = f"""
        from airflow_provider_kinetic.core.data.schemes.hf_load import load_hf_to_disk
        load_hf_to_disk("hf://org/name?split=train", {str(target)!r})
    """

    done = _run_python(code, env)

    assert done.returncode == 0, done.stderr
    assert datasets.load_from_disk(str(target))["x"] == [5, 6]
    assert any(r.path.endswith(PARQUET.format(split="train")) for r in hf_hub.requests)
    assert not (tmp_path / ".cache").exists()  # nothing written to the child's ~/.cache


def test_missing_datasets_package_is_named(tmp_path: Path) -> None:
    code = f"""
        import sys
        sys.modules["datasets"] = None  # as if it were not installed
        from airflow_provider_kinetic.core.data.schemes import hf_load
        hf_load.load_hf_to_disk("hf://org/name?split=train", {str(tmp_path / "out")!r})
    """

    done = _run_python(code)

    assert done.returncode == 1
    assert done.stderr.rstrip().endswith(
        "ImportError: hf:// data needs the 'datasets' package in the job's environment "
        "(pip install datasets)"
    ), done.stderr
    assert not (tmp_path / "out").exists()
