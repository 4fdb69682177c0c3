"""Concurrent puts to one key from real processes, on both stores: every put lands in
the history (no lost update), every version reads back whole (never a mix of two
puts), and the pointer names one of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_provider_kinetic.core.keys import fetch
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import ObjectStore
from tests.fixtures.waiting import wait_for

REPO = Path(__file__).resolve().parents[4]
PUTS = 6
FILES = 8

PUTTER = """
import os, sys, time
from pathlib import Path
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import LocalStore

scheme, where, tag, work, go, puts, files = sys.argv[1:]
if scheme == "file":
    store = LocalStore(where)
else:
    from airflow_provider_kinetic.core.storage.gcs import GcsStore
    store = GcsStore(where)
keys = KeyStore(store, who=lambda: {"putter": tag}, keep=100)
Path(work, f"ready-{tag}").write_text("")
while not os.path.exists(go):  # both start together
    time.sleep(0.001)
for i in range(int(puts)):
    src = Path(work, f"{tag}-{i}")
    for j in range(int(files)):
        (src / f"d{j % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{j % 3}" / f"f{j}.txt").write_text(f"{tag}-{i}")
    keys.put("shared/model", src)
"""


def _where(store: ObjectStore) -> str:
    return store.bucket


def test_two_processes_putting_one_key(store: ObjectStore, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    go = tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KINETIC_STATCACHE_DIR": str(tmp_path / "statcache"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PUTTER, store.scheme, _where(store), tag, str(work), str(go)]
            + [str(PUTS), str(FILES)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    try:
        wait_for("both putters", lambda: all((work / f"ready-{t}").exists() for t in "ab"), 60)
        go.write_text("")
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    keys = KeyStore(store)
    state = keys.state("shared/model")
    assert state is not None
    # No lost update: all 2 x PUTS distinct versions are in the history.
    assert len({v.version for v in state.versions}) == 2 * PUTS
    assert {v.by["putter"] for v in state.versions} == {"a", "b"}
    assert keys.ls("shared/")[0]["version"] == state.current.version
    for v in state.versions:
        dest = tmp_path / "out" / v.version
        fetch.get(keys, "shared/model", dest, version=v.version)
        texts = {p.read_text() for p in dest.rglob("*.txt")}
        assert len(texts) == 1, f"version {v.version} mixes puts: {texts}"
        assert len(list(dest.rglob("*.txt"))) == FILES
