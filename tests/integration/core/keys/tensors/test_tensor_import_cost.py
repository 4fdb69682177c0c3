"""torch stays optional: a process that imports the provider and uses file keys (put,
get, ls, a BroadcastWindow) imports neither torch nor safetensors.  Measured in a
fresh interpreter, inside a job's environment (the store from ``GCS_BUCKET``, no
Airflow connection), so nothing imported earlier by pytest hides an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
from airflow_provider_kinetic import BroadcastWindow, store
src, dest = sys.argv[1], sys.argv[2]
row = store.put("files/a", src)
got = store.get("files/a", dest)
rows = store.ls("files/")
BroadcastWindow(world_size=4)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "safetensors"))
print(json.dumps({"heavy": heavy, "same": got["version"] == row["version"], "n": len(rows)}))
"""


def test_file_keys_import_neither_torch_nor_safetensors(tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("weights")
    env = {**os.environ, "JOB_ID": "job-import", "GCS_BUCKET": str(tmp_path / "bucket")}
    env["KINETIC_STATCACHE_DIR"] = str(tmp_path / "statcache")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(src), str(tmp_path / "out.txt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"heavy": [], "same": True, "n": 1}
    assert (tmp_path / "out.txt").read_text() == "weights"
