"""``benchmarks/run.py --quick`` runs end to end and prints the table with every row.

The suite proves the benchmark works, not that a speed goal is met: speed goals are
wall-clock times and ratios, which a loaded machine misses by chance, so the table
reports them (pass or FAIL) and the suite only checks that each such row is there,
with well-formed numbers, from a run that did what it should (every task succeeded,
no upload after the first put, no cluster client imported...).  The correctness checks
the benchmark makes on the way (equal hashes, equal bucket layouts, every child's
copy) end it with an error, which fails the test.  Rows whose goals are counts, bytes
or memory that the code decides (a write budget, fake clocks, traced memory, bytes
read from the store) hold at any size and any load: those must pass.
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
#: broadcast rows (issue 27): per key, bytes from the store (a count), the time, on paper
BROADCAST = [
    f"broadcast {what} to 4 children, fanout 2, 50 ms RTT, 200 MB/s shared: {row}"
    for what in ("one 4 MiB key", "40 x 64 KiB files")
    for row in ("bytes read from the store", "until every child holds it",
                "on paper, 1,000 pods at fanout 50 (2 hops)")
]  # fmt: skip
#: rows whose goals hold at any size and load: budgets, counts, bytes, memory
MUST_PASS = [
    "batch of 20 trivial inputs, local, max_concurrent 16",
    "batch of 24 inputs: store writes (local, max_concurrent 64, driven by the trigger's "
    "BatchDriver)",
    "batch of 24 inputs: trigger state bytes per input",
    "batch of 24 inputs: peak RSS of the driving process",
    "status reads, 10-minute GKE job, poll_interval 5 s",
    "triggerer API calls/min, 10 -> 50 deferred GKE jobs",
    "triggerer memory per deferred GKE job, 50 jobs",
    *BROADCAST[0::3],
]
#: job overhead rows (dag.test() runs): each shows what ours added to its baseline
OVERHEAD = [
    "job overhead: trivial function, sync, local",
    "job overhead: trivial function, deferrable, local",
    "job overhead: 7 s job, deferrable (it defers), local",
    "deferral overhead: 7 s job deferred vs Airflow's own 7 s deferral, local",
]
SPLIT = "deferral overhead less a job's own start and collect, local"
SWEEP = "deferrable sweep: a freed slot until the next child starts, local"
PUT = "store.put unchanged 2,000 files"
IMPORT = "DAG file import above airflow.sdk, local DAG (operator, map, @task.kinetic)"
#: rows with speed goals (or none): reported, whichever way they went
TIMED = [
    "first hash, 2,000 files",
    "hash one 64 MiB file",
    "hash one 64 MiB file vs kinetic",
    "re-hash unchanged 2,000 files, new process",
    "re-hash unchanged 2,000 files, new process, Python path",
    "re-hash unchanged 2,000 files, same process",
    PUT,
    IMPORT,
    "upload 200 small files, 50 ms RTT",
    "upload 200 small files, no added latency",
    "batch of 24 inputs: seconds per input",
    *OVERHEAD,
    SPLIT,
    SWEEP,
    *[
        f"{case}, {link}"
        for case in (
            "runner download 20 x 1 MiB files",
            "runner download one 64 MiB file",
            "upload one 64 MiB file",
        )
        for link in ("50 ms RTT, 10 MB/s per connection", "no added latency or cap")
    ],
    *[row for row in BROADCAST if row not in MUST_PASS],
]
HEADER = "| case | baseline | ours | ratio | goal | result |"


def well_formed(cells: list[str]) -> bool:
    """A row's cells: a number in ours (and in the baseline, unless it has none), a
    ratio or none, a goal, a result; no NaN or infinity anywhere."""
    _, baseline, ours, ratio, goal, result = cells
    number = re.compile(r"\d")
    return (
        bool(number.search(ours))
        and (baseline == "-" or bool(number.search(baseline)))
        and re.fullmatch(r"-|\d+\.\d\dx", ratio) is not None
        and bool(goal)
        and result in ("pass", "FAIL", "info")
        and not re.search(r"\b(nan|inf)\b", " ".join(cells), re.IGNORECASE)
    )


@requires_fake_gcs
@pytest.mark.timeout(600)
def test_quick_benchmark_prints_every_row(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("STORAGE_EMULATOR_HOST", None)
    done = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--repeat", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=580,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert HEADER in lines
    table = [line for line in lines[lines.index(HEADER) + 2 :] if line.startswith("| ")]
    cells = {}
    for line in table:
        row = line.strip("| ").split(" | ")
        assert len(row) == 6 and well_formed(row), line
        cells[row[0]] = row
    # Every row, each once, and no other.
    assert sorted(cells) == sorted(MUST_PASS + TIMED) and len(table) == len(cells), done.stdout
    notes = {case: line for line in lines for case in cells if line.startswith(f"- {case}: ")}

    for case in MUST_PASS:  # budgets, counts, bytes and memory: they hold
        assert cells[case][-1] == "pass", (cells[case], notes.get(case))
    # The timed rows' runs did what they should (the result is the speed goal's alone).
    for case in OVERHEAD:
        assert "task states" not in notes[case], notes[case]  # every task succeeded
    assert cells[SWEEP][2].startswith("max ") and "; run " not in notes[SWEEP], notes[SWEEP]
    put_ok = "uploads after the first put: 0 (goal 0); the version is the re-hash: True"
    assert put_ok in notes[PUT], notes[PUT]
    assert "HEAVY MODULES" not in notes[IMPORT], notes[IMPORT]
    assert re.fullmatch(r"\d+\.\d{3} s", cells[IMPORT][2]), cells[IMPORT]
    # Each overhead row shows what ours added to its baseline, and the GKE row that the
    # trigger's event came after the whole (fake) 10 minutes.
    for case in OVERHEAD:
        assert " s (+" in cells[case][2], cells[case]
    assert "x Airflow's" in cells[OVERHEAD[-1]][2] and "from the function's end" in done.stdout
    assert "x Airflow's" in cells[SPLIT][2] and cells[SPLIT][-1] == "info"
    assert cells[MUST_PASS[4]][2].startswith("121 (") and "event SUCCEEDED" in done.stdout
    assert "machine:" in done.stdout and re.search(r"(?<![\d,])0 of 2,000 files read", done.stdout)
    assert list(tmp_path.iterdir()) == []  # the benchmark cleaned up after itself
