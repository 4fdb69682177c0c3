"""Speed against keras-kinetic 0.0.4, measured side by side in one run.

    .venv/bin/python benchmarks/run.py [--quick] [--repeat N]

Prints one table (case, baseline, ours, ratio, goal, pass/fail) for:

1. first content hash of a tree of small files (kinetic's ``Data.content_hash``);
2. hashing one big file, against hashlib's single-core rate (and kinetic);
3. re-hashing unchanged data from a new process (the persistent stat cache) and
   within one process;
4. the first upload of 2,000 small files to the real fake-gcs-server, with 50 ms of
   round trip added by a loopback proxy, and without it (kinetic's ``upload_data``);
5. a batch of 1,000 trivial inputs on the local backend (wall time, write budget);
   and (``batch10k``) batches of 1,000 and 10,000 driven as a deferred map task's
   trigger drives them (writes, state bytes, peak memory, time per input; the
   longest case: 11,000 runner processes);
6. job overhead: a trivial function's task time, sync and deferrable, above a plain
   ``@task`` under ``dag.test()``, and the status reads a 10-minute GKE job makes;
7. transfers: the runner's download of many 1 MiB files and of one big file, and the
   upload of one big file, against kinetic's own code through the latency proxy with
   a per-connection cap (``--mbps``), and without it (info).
8. one triggerer with 10 / 100 / 1,000 deferred GKE jobs: API calls per minute and
   memory per job (``cases_triggerer.py``).
9. broadcast of a key to a batch's children as a tree, against every child reading
   the store (bytes from the store, time; 1,000 pods on paper): ``cases_broadcast.py``.
10. what a local DAG file adds to Airflow's own import when it imports the provider
    (``cases_import.py``).
11. (``--only standalone``, not in ``--quick``) deferred 7 s and 20 s jobs under
    ``airflow standalone`` against ``DateTimeSensorAsync`` of the same length: the
    trigger ending the task, and the worker resuming it (``cases_standalone.py``).
12. (``--only incremental sweep``, not in a default run) incremental Data
    (``cases_incremental.py``): re-uploading a 2,000-file ~195 MiB
    tree with one file changed (bytes sent and bucket growth, counted at the store,
    against kinetic's full re-upload), and a local sweep of 8 children over a 200 MB
    Data tree (seconds per child on its Data, against the copy each child made before).
13. (``--only backfill``, not in ``--quick``) a 30-date backfill under ``airflow
    standalone`` with five dates' data changed, with ``cache=True`` against the same
    DAG without it, then the same backfill again (``cases_backfill.py``).

Each ratio is kinetic's (or the baseline's) time over ours, best of ``--repeat``
interleaved runs.  ``--quick`` uses small sizes (the test suite runs it); its ratios
are not the goals' measure.  Exit status 0 even when a goal fails: the table says.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import cases_backfill  # noqa: E402
import cases_batch  # noqa: E402
import cases_batch10k  # noqa: E402
import cases_broadcast  # noqa: E402
import cases_hash  # noqa: E402
import cases_import  # noqa: E402
import cases_incremental  # noqa: E402
import cases_keys  # noqa: E402
import cases_overhead  # noqa: E402
import cases_polls  # noqa: E402
import cases_standalone  # noqa: E402
import cases_transfer  # noqa: E402
import cases_triggerer  # noqa: E402
import cases_upload  # noqa: E402
import kinetic_ref  # noqa: E402
from table import Row, render  # noqa: E402

FULL = {"files": 20_000, "size": 4096, "big": 1 << 30, "upload": 2_000, "batch": 1_000,
        "pod_files": 2_000, "pod_big": 2 << 30}  # fmt: skip
CASES = ["hash", "big", "rehash", "keys", "upload", "batch", "overhead", "transfer", "triggerer",
         "batch10k", "broadcast", "import", "incremental", "sweep", "standalone",
         "backfill"]  # fmt: skip
#: Cases a run makes only when ``--only`` names them (minutes each, no --quick size).
ON_REQUEST = {"standalone", "incremental", "sweep", "backfill"}
QUICK = {"files": 2_000, "size": 4096, "big": 64 << 20, "upload": 200, "batch": 20,
         "pod_files": 20, "pod_big": 64 << 20}  # fmt: skip
FULL["batch10k"], QUICK["batch10k"] = (1_000, 10_000), (8, 24)  # type: ignore[assignment]
#: broadcast: one big key, many files (count, size), children, fanout
FULL["bcast"] = (1 << 30, 2_000, 512 << 10, 16, 4)  # type: ignore[assignment]
QUICK["bcast"] = (4 << 20, 40, 64 << 10, 4, 2)  # type: ignore[assignment]
#: incremental Data: (files, bytes each) of the re-uploaded tree and of the sweep's tree
FULL["inc"], QUICK["inc"] = (2_000, 100 << 10), (100, 4 << 10)  # type: ignore[assignment]
FULL["sweep"], QUICK["sweep"] = (2_000, 100_000), (50, 4_000)  # type: ignore[assignment]
#: deferred jobs in one triggerer (shared reads), and per-job polling (before) for comparison
TRIGGERER = {"full": ((10, 100, 1_000), (10, 100)), "quick": ((10, 50), (10,))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument(
        "--mbps", type=float, default=10.0, help="transfer cases: per-connection cap, MB/s"
    )
    parser.add_argument(
        "--bcast-mbps", type=float, default=200.0,
        help="broadcast case: the store's cap shared by every child, MB/s",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", choices=CASES)
    parser.add_argument(
        "--transfer-rows", nargs="*", choices=cases_transfer.ROWS,
        help="transfer case: only these rows (many: the 1 MiB files, big, up: the big file)",
    )  # fmt: skip
    ns = parser.parse_args(argv)
    sizes = QUICK if ns.quick else FULL
    only = set(ns.only or set(CASES) - ON_REQUEST)
    no_kinetic_side = {"keys", "broadcast", "import", "standalone", "backfill"}
    if only - no_kinetic_side and kinetic_ref.kinetic_dir() is None:
        print("keras-kinetic 0.0.4 is not installed: pip install --no-deps keras-kinetic==0.0.4")
        return 2
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kinetic-bench-") as tmp_s:
        tmp = Path(tmp_s)
        # Our stat cache goes here, never into the user's AIRFLOW_HOME.
        os.environ["KINETIC_STATCACHE_DIR"] = str(tmp / "statcache")
        # [kinetic] local_max_jobs (default: the CPU count) would queue the batch case's
        # children below the max_concurrent it measures: the limit is set to that
        # concurrency, so the case runs as many jobs at once as before the limit existed.
        # Its slots are this run's own (not the machine's, shared with other runs).
        concurrency = inspect.signature(cases_batch.batch).parameters["max_concurrent"].default
        os.environ["KINETIC_LOCAL_MAX_JOBS"] = str(concurrency)
        os.environ["KINETIC_LOCAL_SLOTS"] = str(tmp / "slots")
        n, size = sizes["files"], sizes["size"]
        tree = tmp / "tree"
        if only & {"hash", "rehash", "keys"}:  # the hashing cases' tree
            written = cases_hash.make_tree(tree, n, size)
            print(f"tree: {n:,} files x {size // 1024} KiB", flush=True)
        if "hash" in only:
            rows.append(cases_hash.first_hash(tree, n, ns.repeat, tmp))
        if "big" in only:
            big = tmp / "big.bin"
            cases_hash.make_big_file(big, sizes["big"])
            rows.extend(cases_hash.big_file(big, ns.repeat))
            big.unlink()
        if "rehash" in only:
            cases_hash.wait_until_not_racy(written)
            rows.extend(cases_hash.rehash(tree, n, ns.repeat, tmp))
        if "keys" in only:
            cases_hash.wait_until_not_racy(written)
            rows.append(cases_keys.unchanged_put(tree, n, ns.repeat, tmp))
        print("hashing done", flush=True)
        if "import" in only:
            rows.append(cases_import.import_cost(tmp / "import", ns.repeat))
        if "upload" in only:
            small = tmp / "upload"
            cases_hash.make_tree(small, sizes["upload"], size, per_dir=250)
            rows.extend(cases_upload.upload(small, sizes["upload"], ns.repeat, ns.rtt_ms))
            print("uploads done", flush=True)
        if "batch" in only:
            rows.append(cases_batch.batch(tmp / "batch", sizes["batch"]))
        if "batch10k" in only:
            rows.extend(cases_batch10k.big_batch(tmp / "batch10k", *sizes["batch10k"]))
            print("big batch done", flush=True)
        if "overhead" in only:
            rows.extend(cases_overhead.overhead(ns.repeat))
            rows.append(cases_polls.gke_status_reads())
            print("overhead done", flush=True)
        if "transfer" in only:
            rows.extend(
                cases_transfer.transfer(
                    tmp,
                    sizes["pod_files"],
                    sizes["pod_big"],
                    ns.repeat,
                    ns.rtt_ms,
                    ns.mbps,
                    ns.transfer_rows,
                )
            )
            print("transfers done", flush=True)
        if "triggerer" in only:
            rows.extend(cases_triggerer.triggerer(*TRIGGERER["quick" if ns.quick else "full"]))
        if "broadcast" in only:
            rows.extend(cases_broadcast.broadcast(tmp, *sizes["bcast"], ns.rtt_ms, ns.bcast_mbps))
        if "incremental" in only:
            rows.extend(cases_incremental.incremental(tmp, *sizes["inc"]))
            print("incremental upload done", flush=True)
        if "sweep" in only:
            rows.extend(cases_incremental.sweep(tmp, *sizes["sweep"]))
            print("sweep done", flush=True)
        if "standalone" in only:
            rows.extend(cases_standalone.deferral(ns.repeat))
        if "backfill" in only:
            rows.extend(cases_backfill.backfills())
    title = "airflow-provider-kinetic vs keras-kinetic 0.0.4" + (" (--quick)" if ns.quick else "")
    print(render(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
