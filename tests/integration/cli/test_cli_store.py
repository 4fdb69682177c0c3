"""``airflow kinetic store put|get|ls|rm`` (and ``data gc`` with keys) against a local
root, the CLI's ``main`` called in this process (``tests/fixtures/cli.py``; real
processes of both entry points are ``test_cli.py``'s and ``test_cli_stdout.py``'s)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data.refs import marker_key
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from tests.fixtures.cli import run_cli
from tests.fixtures.local_conn import local_extra, set_local_conn

CONN = "kn_store_cli"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KineticConfig:
    """A local connection (gs:// is covered by test_keys.py: the CLI is a thin layer
    over the same calls)."""
    root = set_local_conn(monkeypatch, tmp_path / "root", CONN)
    monkeypatch.setenv("KINETIC_STATCACHE_DIR", str(tmp_path / "statcache"))
    return KineticConfig(**local_extra(root))


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``store ARGS`` with this module's connection, called in this process."""
    out = run_cli("store", *args, "--conn-id", CONN)
    assert (out.returncode == 0) is ok, f"{args}\nstdout:{out.stdout}\nstderr:{out.stderr[-3000:]}"
    return out


def as_json(*args: str) -> Any:
    return json.loads(cli(*args, "-o", "json").stdout)


def model(tmp_path: Path, text: str) -> Path:
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True, exist_ok=True)
    (src / "sub" / "w.bin").write_text(text)
    return src


def test_put_ls_get(config: KineticConfig, tmp_path: Path) -> None:
    """put, then ls and get (a version by its prefix)."""
    keys = KeyStore(config.store())
    first = as_json("put", "models/churn", str(model(tmp_path, "one")), "--ttl", "7d")
    assert first["uploaded"] is True and first["files"] == 1
    assert set(first["by"]) == {"user", "host"}
    second = keys.put("models/churn", model(tmp_path, "two"))

    table = cli("ls").stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.split()[:2] == ["KEY", "VERSION"])
    row = table[header + 1].split()
    assert row[:2] == ["models/churn", second["version"][:12]] and "2" in row

    got = as_json("get", "models/churn", str(tmp_path / "out"), "--version", first["version"][:8])
    assert got["version"] == first["version"]
    assert (tmp_path / "out" / "sub" / "w.bin").read_text() == "one"


def test_rm_dry_run_and_a_bad_key(config: KineticConfig, tmp_path: Path) -> None:
    keys = KeyStore(config.store())
    keys.put("models/churn", model(tmp_path, "one"))
    second = keys.put("models/churn", model(tmp_path, "two"))
    dry = as_json("rm", "models/churn", "--version", second["version"], "--dry-run")
    assert [(r["version"], r["action"]) for r in dry] == [(second["version"], "would remove")]
    assert keys.ls()[0]["version"] == second["version"]  # a dry run moves nothing

    refused = cli("put", "../up", str(tmp_path / "model"), ok=False)
    last = refused.stderr.strip().splitlines()[-1]  # after any Airflow log lines
    assert last.startswith("error: key '../up' has a '..' segment") and "letters, digits" in last
    assert "Traceback" not in refused.stderr and keys.names() == ["models/churn"]


def test_data_gc_expires_keys_and_keeps_what_keys_hold(
    config: KineticConfig, tmp_path: Path
) -> None:
    keys = KeyStore(config.store())
    first = keys.put("models/churn", model(tmp_path, "one"))
    second = keys.put("models/churn", model(tmp_path, "two"))
    (tmp_path / "b").write_text("short-lived")
    short = keys.put("drop/me", tmp_path / "b", ttl=0.001)
    gc = ["data", "gc", "--older-than", "0s", "--conn-id", CONN, "-o", "json"]
    gc += ["--force"]  # no Airflow database here: the XCom side is test_keyio.py's
    out = run_cli(*gc)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    rows = {(r["hash"], r.get("action")) for r in found}
    assert (short["version"], "expired") in rows and (short["version"], "deleted") in rows
    held = {r["hash"]: r.get("held_by") for r in found}
    assert held[second["version"]] == [f"key models/churn version {second['version'][:12]} (kept)"]
    assert held[first["version"]] == [f"key models/churn version {first['version'][:12]} (kept)"]
    store = config.store()
    assert store.exists(marker_key(second["version"]))
    assert not store.exists(marker_key(short["version"]))
    assert keys.names() == ["models/churn"]
