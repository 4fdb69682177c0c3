"""``store.ls(key, versions=True)`` and ``airflow kinetic store ls KEY --versions``:
every kept version of a key, newest first, with its hash, time, size and the task
instances that pinned it (the CLI called in-process, through its own ``main``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic import store as public_store
from airflow_provider_kinetic.cli.__main__ import main
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data.value import Data
from airflow_provider_kinetic.core.keys.pins import pin_values
from tests.fixtures.local_conn import local_extra, set_local_conn

CONN = "kn_store_versions"
KEY = "models/churn"
#: The task instance whose run pinned the first version (a retry of it reads that one).
PINNER = {"dag_id": "score", "run_id": "manual__1", "task_id": "predict", "map_index": -1}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KineticConfig:
    """A local kinetic connection, as the CLI and ``store`` find it (the environment)."""
    root = set_local_conn(monkeypatch, tmp_path / "root", CONN)
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "statcache"))
    return KineticConfig(**local_extra(root))


def put(tmp_path: Path, key: str, text: str) -> dict[str, Any]:
    src = tmp_path / "src" / key / str(len(text))
    src.mkdir(parents=True)
    (src / "w.bin").write_text(text)
    return public_store.put(key, src, conn_id=CONN)


@pytest.fixture
def three(config: KineticConfig, tmp_path: Path) -> list[dict[str, Any]]:
    """``KEY`` put three times with different content, newest first; a task instance
    pinned the first version (as a ``kinetic://`` input does) before the others."""
    first = put(tmp_path, KEY, "one")
    _, pins = pin_values(config.store(), PINNER, [Data(f"kinetic://{KEY}")])
    assert [p.version for p in pins] == [first["version"]]
    second = put(tmp_path, KEY, "two:)")
    third = put(tmp_path, KEY, "three:)")
    put(tmp_path, "models/other", "not listed under models/churn")
    return [third, second, first]


def test_ls_versions_lists_every_kept_version_newest_first(three: list[dict]) -> None:
    rows = public_store.ls(KEY, versions=True, conn_id=CONN)
    assert [r["version"] for r in rows] == [p["version"] for p in three]
    assert len({r["version"] for r in rows}) == 3
    assert [r["size"] for r in rows] == [7, 5, 3]
    assert [r["time"] for r in rows] == [p["time"] for p in three]
    assert [r["current"] for r in rows] == [True, False, False]
    assert [r["pins"] for r in rows] == [[], [], [PINNER]]
    assert {r["key"] for r in rows} == {KEY} and all(r["files"] == 1 for r in rows)
    # The plain ls still gives one row per key, its current version and the count.
    (plain,) = public_store.ls(KEY, conn_id=CONN)
    assert plain["version"] == three[0]["version"] and plain["versions"] == 3


def test_only_retained_versions_are_listed(
    config: KineticConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[kinetic] store_keep_versions`` = 2: the oldest of three puts is gone."""
    monkeypatch.setenv("AIRFLOW__KINETIC__STORE_KEEP_VERSIONS", "2")
    puts = [put(tmp_path, "models/short", text) for text in ("a", "bb", "ccc")]
    rows = public_store.ls("models/short", versions=True, conn_id=CONN)
    assert [r["version"] for r in rows] == [puts[2]["version"], puts[1]["version"]]
    assert public_store.ls("models/none", versions=True, conn_id=CONN) == []


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()  # what came before
    main(["store", "ls", *args, "--conn-id", CONN])
    return capsys.readouterr().out


def test_cli_ls_versions_prints_the_same(
    three: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    listed = json.loads(cli(capsys, KEY, "--versions", "-o", "json"))
    assert listed == public_store.ls(KEY, versions=True, conn_id=CONN)
    assert [r["pins"] for r in listed] == [[], [], [PINNER]]
    fields = {"key", "version", "time", "size", "files", "kind", "by", "current", "pins"}
    assert all(set(r) == fields for r in listed)

    table = cli(capsys, KEY, "--versions").splitlines()
    assert table[0].split() == ["KEY", "VERSION", "TIME", "FILES", "SIZE", "BY", "CURRENT", "PINS"]
    body = table[1:]
    assert [line.split()[1] for line in body] == [p["version"][:12] for p in three]
    assert body[0].split()[-1] == "*" and "*" not in body[1] + body[2]
    assert body[2].endswith("score/predict/manual__1")
    assert "7 B" in body[0] and "5 B" in body[1] and "3 B" in body[2]
