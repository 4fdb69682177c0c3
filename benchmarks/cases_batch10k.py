"""Big batch case: 1,000 and 10,000 trivial inputs, each driven in a fresh process as a
deferred ``KineticMapOperator`` and its trigger drive it (``batch_child.py``), on the
local backend with ``max_concurrent`` 64; every child a real runner process.

Rows, both sizes measured in this run, one after the other:

* writes: at most N + ``EXTRA_WRITES`` objects at both sizes (the shared objects
  once; the manifest and the trigger's state saves follow progress, not time);
* state bytes: what the trigger's saves wrote, per input, no more at 10,000 than at
  1,000 x ``STATE_BYTES_GROWTH`` (each save a delta of what changed: O(N) in all,
  where whole-state saves every 10 s were O(N) each, O(N^2) over the batch);
* peak memory: the driving process's peak RSS under ``PEAK_MB`` (``ru_maxrss``);
* per-input time: wall seconds per input at 10,000 no more than at 1,000.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from table import Row

HERE = Path(__file__).resolve().parent
EXTRA_WRITES = 48
PEAK_MB = 300.0
STATE_BYTES_GROWTH = 1.5
MAX_CONCURRENT = 64


def drive(root: Path, n: int, timeout_s: float) -> dict:
    """One batch in a fresh process (so its peak RSS is its own); its JSON line."""
    root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(HERE / "batch_child.py"), str(n), str(MAX_CONCURRENT), str(root)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"batch_child.py {n} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def big_batch(root: Path, small: int, big: int, timeout_s: float = 7200.0) -> list[Row]:
    """The rows above for ``small`` and ``big`` inputs (1,000 and 10,000 in full)."""
    runs = [drive(root / str(n), n, timeout_s) for n in (small, big)]
    a, b = runs
    where = f"local, max_concurrent {MAX_CONCURRENT}, driven by the trigger's BatchDriver"

    def writes_ok(r: dict) -> bool:
        shared_once = all(c == 1 for c in r["shared"].values()) and len(r["shared"]) >= 3
        return r["writes"] <= r["n"] + EXTRA_WRITES and shared_once and r["correct"]

    per_a, per_b = a["wall"] / a["n"], b["wall"] / b["n"]
    bytes_a, bytes_b = a["state_bytes"] / a["n"], b["state_bytes"] / b["n"]
    return [
        Row(
            f"batch of {big:,} inputs: store writes ({where})",
            f"N={small:,}: N+{a['writes'] - a['n']}",
            f"N={big:,}: N+{b['writes'] - b['n']}",
            None,
            f"writes <= N+{EXTRA_WRITES} at both sizes, shared objects once",
            writes_ok(a) and writes_ok(b),
            f"state saves {a['state_saves']} / {b['state_saves']}; polls {a['polls']} / "
            f"{b['polls']}; results {'correct' if a['correct'] and b['correct'] else 'WRONG'}",
        ),
        Row(
            f"batch of {big:,} inputs: trigger state bytes per input",
            f"N={small:,}: {bytes_a:.0f} B",
            f"N={big:,}: {bytes_b:.0f} B",
            None,
            f"<= {STATE_BYTES_GROWTH:g}x the N={small:,} bytes per input",
            bytes_b <= STATE_BYTES_GROWTH * bytes_a,
            f"largest save {a['max_state_save']:,} / {b['max_state_save']:,} B; the event "
            f"{a['event_bytes']:,} / {b['event_bytes']:,} B, the kwargs "
            f"{a['kwargs_bytes']:,} / {b['kwargs_bytes']:,} B (once each)",
        ),
        Row(
            f"batch of {big:,} inputs: peak RSS of the driving process",
            f"N={small:,}: {a['rss_peak_mb']:.0f} MB",
            f"N={big:,}: {b['rss_peak_mb']:.0f} MB",
            None,
            f"< {PEAK_MB:g} MB",
            b["rss_peak_mb"] < PEAK_MB and a["rss_peak_mb"] < PEAK_MB,
            f"ru_maxrss; {b['rss_before_mb']:.0f} MB before the batch",
        ),
        Row(
            f"batch of {big:,} inputs: seconds per input",
            f"N={small:,}: {per_a * 1000:.1f} ms ({a['wall']:.0f} s)",
            f"N={big:,}: {per_b * 1000:.1f} ms ({b['wall']:.0f} s)",
            per_a / per_b if per_b else None,
            f"<= the N={small:,} time per input",
            per_b <= per_a,
            f"driver CPU per input {a['cpu'] / a['n'] * 1000:.1f} / "
            f"{b['cpu'] / b['n'] * 1000:.1f} ms",
        ),
    ]
