"""``locale="local"`` keys in ``store.ls`` and with ``ttl=``: inside a job (its env
set here, in-process: the real peer server on loopback, the real registry on a local
store root) ``ls`` lists the local keys of the job's scope beside the store's, each
row marked by its ``locale``; the CLI's ``ls`` (outside a job) is the store's alone.
A local key past its ttl is never read: the store's key is, or the error says it
expired."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.keys.joblocal import job_ended
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError, KeyNotFound
from airflow_provider_kinetic.core.keys.peer.registry import (
    Peer,
    PeerRegistry,
    board_name,
    peer_token,
)
from airflow_provider_kinetic.keys import store
from tests.integration.cli.test_cli_store import cli, config  # noqa: F401 - the fixture, by name

SCOPE = "grp-ls-ttl"


@pytest.fixture
def job(config: KineticConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyStore]:  # noqa: F811
    """This process as a job of batch ``SCOPE`` on the connection's root; its end
    (registrations removed, peer server stopped) at teardown."""
    keys = KeyStore(config.store())
    monkeypatch.setenv("JOB_ID", "job-ls")
    monkeypatch.setenv("GCS_BUCKET", keys.store.bucket)
    monkeypatch.setenv("KINETIC_PEER_SCOPE", SCOPE)
    monkeypatch.setenv("KINETIC_PEER_TOKEN", peer_token(b"deployment-secret", SCOPE))
    yield keys
    job_ended()


def tree(path: Path, text: str) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "w.bin").write_text(text)
    (path / "cfg.json").write_text("{}")
    return path


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["key"], r["locale"]): r for r in rows}


def test_ls_in_a_job_shows_its_scopes_local_keys(job: KeyStore, tmp_path: Path) -> None:
    kept = store.put("models/a", tree(tmp_path / "a", "stored"))
    local = store.put("models/b", tree(tmp_path / "b", "served"), locale="local")
    both = store.put("models/a", tree(tmp_path / "a2", "local too"), locale="local")
    # Another batch's local key, on its own scope's board: never seen here.
    other = PeerRegistry(job.store, "grp-other")
    other.register(board_name("local", "models/c"), Peer("x", "127.0.0.1:1", "ab" * 32))

    rows = store.ls()
    assert sorted(by_key(rows)) == [
        ("models/a", "local"),
        ("models/a", "store"),
        ("models/b", "local"),
    ]
    assert [r["locale"] for r in rows if r["key"] == "models/a"] == ["store", "local"]
    a, b = by_key(rows)[("models/a", "store")], by_key(rows)[("models/b", "local")]
    assert a["version"] == kept["version"] and "address" not in a
    assert (b["version"], b["address"], b["files"], b["size"]) == (
        local["version"],
        local["address"],
        2,
        local["size"],
    )
    assert b["by"]["job_id"] == "job-ls" and b["expires"] is None
    assert by_key(rows)[("models/a", "local")]["version"] == both["version"] != kept["version"]
    assert [(r["key"], r["locale"]) for r in store.ls("models/b")] == [("models/b", "local")]

    # Outside a job the CLI's ls is the store's keys, columns unchanged.
    listed = json.loads(cli("ls", "-o", "json").stdout)
    assert [r["key"] for r in listed] == ["models/a"] and "locale" not in listed[0]
    assert [r["key"] for r in job.ls()] == ["models/a"]

    job_ended()  # the job ends: its local keys with it
    assert [(r["key"], r["locale"]) for r in store.ls()] == [("models/a", "store")]


def test_a_local_key_expires_after_its_ttl(job: KeyStore, tmp_path: Path) -> None:
    src = tree(tmp_path / "t", "short-lived")
    with pytest.raises(KeyNameError, match=r"ttl 'soon' is not valid"):
        store.put("models/t", src, locale="local", ttl="soon")
    assert store.ls() == []  # refused before anything was served or registered

    put = store.put("models/t", src, locale="local", ttl="1h")
    assert put["expires"] is not None and put["expires"].endswith("Z")
    (row,) = store.ls()
    assert (row["locale"], row["expires"]) == ("local", put["expires"])
    got = store.get("models/t", tmp_path / "got1")
    assert got["locale"] == "local" and (tmp_path / "got1" / "sub" / "w.bin").exists()

    # The ttl passes (its registration's expiry moved into the past).
    registry, board = PeerRegistry(job.store, SCOPE), board_name("local", "models/t")
    (peer,) = registry.lookup(board)
    registry.update(board, peer.peer_id, extra={**peer.extra, "expires": peer.joined - 1})
    assert store.ls() == []
    with pytest.raises(KeyNotFound, match=r"key 'models/t' was published with locale='local' "
                       r"and its ttl passed at \d{4}-\d\d-\d\dT[\d:]+Z"):  # fmt: skip
        store.get("models/t", tmp_path / "got2")
    assert not (tmp_path / "got2").exists()

    # With the key also in the store, a get after the ttl reads the store's copy.
    stored = store.put("models/t", src)
    got = store.get("models/t", tmp_path / "got3")
    assert got.get("locale") != "local" and got["version"] == stored["version"]
    assert (tmp_path / "got3" / "sub" / "w.bin").read_text() == "short-lived"
