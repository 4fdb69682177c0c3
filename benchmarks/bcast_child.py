"""One child of the broadcast benchmark (``cases_broadcast.py``), as a real process
with a job's peer env, doing what a batch child's function does with a key.

It imports everything and prints ``ready``; then, per line on stdin, ``get KEY DEST
FANOUT`` gets the key (FANOUT 0: a plain ``store.get`` from the store, else by
broadcast), timed, and prints the row as JSON; ``end`` ends it as its runner would
(``job_ended``).  So a measured time is the transfer, not Python's start, and one
set of children serves every round (as pods that keep running).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_kinetic.core.keys.joblocal import job_ended  # noqa: E402
from airflow_provider_kinetic.core.keys.peer.window import BroadcastWindow  # noqa: E402
from airflow_provider_kinetic.keys import store  # noqa: E402


def main() -> int:
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "end":
            break
        _, key, dest, fanout = words
        start = time.perf_counter()
        if int(fanout):
            window = BroadcastWindow(fanout=int(fanout), timeout=120)
            row = store.get(key, dest, broadcast=window)
        else:
            row = store.get(key, dest)
        row["seconds"] = time.perf_counter() - start
        print(json.dumps(row), flush=True)
    job_ended()
    return 0


if __name__ == "__main__":
    sys.exit(main())
