"""``benchmarks/run.py --quick`` runs end to end and prints the table with every row.

The goals are judged by the full run (docs/PERFORMANCE.md); here the sizes are too small
for ratios to mean much, so only the table's shape and the correctness checks the
benchmark makes on the way (equal hashes, equal bucket layouts, right batch results,
the write budget) are asserted.  The job-overhead rows are the exception: their goals
(at most 1.5 s above a plain ``@task``; no more GKE status reads than before) are
fixed costs and counts, not ratios, so they must pass at any size.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.fake_gcs import requires_fake_gcs

REPO = Path(__file__).resolve().parents[2]
ROWS = [
    "first hash, 2,000 files",
    "hash one 64 MiB file",
    "hash one 64 MiB file vs kinetic",
    "re-hash unchanged 2,000 files, new process",
    "re-hash unchanged 2,000 files, same process",
    "store.put unchanged 2,000 files",
    "upload 200 small files, 50 ms RTT",
    "upload 200 small files, no added latency",
    "batch of 20 trivial inputs, local, max_concurrent 16",
    "batch of 24 inputs: store writes (local, max_concurrent 64, driven by the trigger's "
    "BatchDriver)",
]
#: rows whose goals hold at any size (the overhead rows' info row only has to exist)
MUST_PASS = [
    "job overhead: trivial function, sync, local",
    "job overhead: trivial function, deferrable, local",
    "status reads, 10-minute GKE job, poll_interval 5 s",
    "deferrable sweep: a freed slot until the next child starts, local",
    "batch of 24 inputs: trigger state bytes per input",
    "batch of 24 inputs: peak RSS of the driving process",
    "triggerer API calls/min, 10 -> 50 deferred GKE jobs",
    "triggerer memory per deferred GKE job, 50 jobs",
]
#: the broadcast case's rows (issue 27): bytes from the store are a count (must pass at
#: any size); the time ratio is judged by the full run; the 1,000-pod row is on paper
BROADCAST = [
    f"broadcast {what} to 4 children, fanout 2, 50 ms RTT, 200 MB/s shared: {row}"
    for what in ("one 4 MiB key", "40 x 64 KiB files")
    for row in ("bytes read from the store", "until every child holds it",
                "on paper, 1,000 pods at fanout 50 (2 hops)")
]  # fmt: skip
MUST_PASS += BROADCAST[0::3]
INFO = ["job overhead: 7 s job, deferrable (it defers), local"]
#: (info) what deferring itself adds, beside Airflow's deferral: present here
SPLIT = ["deferral overhead less a job's own start and collect, local"]
#: a ratio to Airflow's own deferral: judged by the full run, present here
RATIOS = ["deferral overhead: 7 s job deferred vs Airflow's own 7 s deferral, local"]
#: the transfer case's rows (issue 23): through the capped proxy, and straight
TRANSFER = [
    f"{case}, {link}"
    for case in (
        "runner download 20 x 1 MiB files",
        "runner download one 64 MiB file",
        "upload one 64 MiB file",
    )
    for link in ("50 ms RTT, 10 MB/s per connection", "no added latency or cap")
]


@requires_fake_gcs
@pytest.mark.timeout(300)
def test_quick_benchmark_prints_every_row(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("STORAGE_EMULATOR_HOST", None)
    done = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--repeat", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=290,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "| case | baseline | ours | ratio | goal | result |" in lines
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    for case in ROWS + MUST_PASS + INFO + RATIOS + SPLIT + TRANSFER + BROADCAST:
        assert case in rows, f"missing row {case!r} in:\n{done.stdout}"
        assert rows[case].rstrip(" |").split(" | ")[-1] in ("pass", "FAIL", "info"), rows[case]
    for case in [*ROWS[-2:], *MUST_PASS]:  # budgets, fixed costs and counts: they hold
        assert rows[case].endswith("| pass |"), rows[case]
    # Each overhead row shows what ours added to its plain @task, and the GKE row that
    # the trigger's event came after the whole (fake) 10 minutes.
    for case in MUST_PASS[:2] + INFO + RATIOS:
        assert " s (+" in rows[case], rows[case]
    assert "x Airflow's" in rows[RATIOS[0]] and "from the function's end" in done.stdout
    assert "x Airflow's" in rows[SPLIT[0]] and rows[SPLIT[0]].endswith("| info |")
    assert "| 121 (" in rows[MUST_PASS[2]] and "event SUCCEEDED" in done.stdout
    assert "machine:" in done.stdout and re.search(r"(?<![\d,])0 of 2,000 files read", done.stdout)
    assert list(tmp_path.iterdir()) == []  # the benchmark cleaned up after itself
