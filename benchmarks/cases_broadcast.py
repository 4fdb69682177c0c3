"""Broadcast case (issue 27): one key to a batch's children, with and without the
tree, the store behind ``latency_proxy.py`` with one shared cap (``--total-mbps``:
what this machine, one VM, may read from the bucket).

The children are real processes with a job's peer env (``bcast_child.py``: the code
a child's function runs, as the GKE double's kubelet would start it), on loopback:
the peers talk to each other directly, and only store reads go through the proxy,
which counts the bytes it carried.  Two keys: one big file, and many files.

- bytes read from the store, over the data's size: every child reading the store
  (the baseline, children x) against the tree (goal: at most 1.25x);
- time from "go" until every child holds its verified copy: the tree against every
  child reading the store (goal: at most 0.4x, a ratio of at least 2.5);
- on paper, from the measured times: 1,000 pods at fanout 50 (two hops).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cases_hash
from cases_upload import _client, fake_gcs
from table import Row

from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.peer.registry import peer_token
from airflow_provider_kinetic.core.storage.gcs import GcsStore

HERE = Path(__file__).resolve().parent
GOAL_BYTES, GOAL_TIME = 1.25, 2.5


class Proxy:
    """The proxy with one shared download cap, counting what it carried."""

    def __init__(self, endpoint: str, rtt_ms: float, total_mbps: float) -> None:
        self.count = Path(tempfile.mkstemp(prefix="bcast-count-")[1])
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "latency_proxy.py"), "--upstream",
             endpoint.removeprefix("http://"), "--rtt-ms", str(rtt_ms),
             "--total-mbps", str(total_mbps), "--count-file", str(self.count),
             "--max-seconds", "7200"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        port = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert port.isdigit(), "the latency proxy did not start"
        self.url = f"http://127.0.0.1:{port}"

    def down(self) -> int:
        """Bytes carried from the store so far."""
        self.proc.stdin.write("\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        assert self.proc.stdout.readline().strip() == "counted"  # type: ignore[union-attr]
        return int(json.loads(self.count.read_text())["down"])

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=30)
        self.count.unlink()


class Children:
    """``n`` children with one batch's peer env, reading the store through the proxy."""

    def __init__(self, proxy: str, bucket: str, n: int) -> None:
        scope = f"bench-{secrets.token_hex(4)}"
        env = {
            **os.environ,
            "GCS_BUCKET": bucket,
            "STORAGE_EMULATOR_HOST": proxy,
            "KINETIC_PEER_SCOPE": scope,
            "KINETIC_PEER_TOKEN": peer_token(b"bench", scope),
        }
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "bcast_child.py")],
                env={**env, "JOB_ID": f"child-{i}"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )  # fmt: skip
            for i in range(n)
        ]
        for p in self.procs:
            assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]

    def get(
        self, key: str, out: Path, fanout: int
    ) -> tuple[float, list[dict], tuple[float, float]]:
        """Seconds from "go" until the last child holds its copy, the rows, and the
        children's user and system CPU seconds meanwhile."""
        before = self.cpu()
        start = time.perf_counter()
        for i, p in enumerate(self.procs):
            p.stdin.write(f"get {key} {out / f'c{i}'} {fanout}\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        rows = [json.loads(p.stdout.readline()) for p in self.procs]  # type: ignore[union-attr]
        seconds = time.perf_counter() - start
        after = self.cpu()
        return seconds, rows, (after[0] - before[0], after[1] - before[1])

    def cpu(self) -> tuple[float, float]:
        """The children's user and system CPU seconds so far (``/proc``; 0 elsewhere):
        on one machine the tree's time is bounded by the CPU its copies cost."""
        user = system = 0.0
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        for p in self.procs:
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                user += int(fields[11]) / tick
                system += int(fields[12]) / tick
        return user, system

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.stdin.write("end\n")  # type: ignore[union-attr]
                    p.stdin.close()  # type: ignore[union-attr]
        for p in self.procs:
            try:
                p.wait(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _one(
    proxy: Proxy, children: Children, key: str, size: int, out: Path, fanout: int,
    link: str, what: str,
) -> list[Row]:  # fmt: skip
    measured: dict[int, tuple[float, int, list[dict], tuple[float, float]]] = {}
    for tree in (0, fanout):
        before = proxy.down()
        seconds, rows, cpu = children.get(key, out, tree)
        read = proxy.down() - before
        versions = {r.get("version") for r in rows}
        assert len(versions) == 1 and None not in versions, f"a child failed: {rows}"
        shutil.rmtree(out)
        out.mkdir()
        measured[tree] = (seconds, read, rows, cpu)
    (t_all, b_all, _, cpu_all), (t_tree, b_tree, rows, cpu_tree) = measured[0], measured[fanout]
    n = len(rows)
    case = f"broadcast {what} to {n} children, fanout {fanout}, {link}"
    ratio = b_tree / size
    bytes_row = Row(
        f"{case}: bytes read from the store", f"every child {b_all / size:.2f}x the data",
        f"{ratio:.2f}x the data", None, f"<= {GOAL_BYTES:g}x", ratio <= GOAL_BYTES,
        "counted by the proxy (object bytes and JSON listings)",
    )  # fmt: skip
    time_row = Row.timed(
        f"{case}: until every child holds it", "every child from the store", t_all, t_tree,
        GOAL_TIME, "the goal 'at most 0.4x' as a ratio: every child from the store / tree; "
        + cpu_note(cpu_all, t_all, cpu_tree, t_tree),
    )  # fmt: skip
    out_rows = [bytes_row, time_row, paper(case, rows, t_all, t_tree, n, fanout)]
    for row in out_rows:  # as they come: a long run that is stopped keeps what it measured
        print(f"{row.case} | {row.baseline} | {row.ours} | {row.goal} | {row.note}", flush=True)
    return out_rows


def cpu_note(
    base: tuple[float, float], t_base: float, tree: tuple[float, float], t_tree: float
) -> str:
    """The children's CPU in each round, beside what the machine has: where the tree
    uses most of it, its time is the CPU its copies cost, not the network's."""
    cores = os.cpu_count() or 1

    def one(cpu: tuple[float, float], seconds: float) -> str:
        used = sum(cpu) / (seconds * cores)
        return f"{cpu[0]:.1f} s user + {cpu[1]:.1f} s system ({used:.0%} of {cores} CPUs)"

    return (
        f"children's CPU: every child from the store {one(base, t_base)}, tree {one(tree, t_tree)}"
    )


def paper(
    case: str, rows: list[dict], t_all: float, t_tree: float, children: int, fanout: int
) -> Row:
    """1,000 pods at fanout 50 (two hops), from the measured times: the root's store
    read, plus per hop the time a parent took to serve its children, scaled from
    ``fanout`` to 50 children sharing its link; against 1,000 readers sharing the
    store's link (the baseline's time per child, times 1,000)."""
    t_root = next(r["seconds"] for r in rows if r["broadcast"]["sources"] == ["store"])
    depth = 1 if children <= 1 + fanout else 2
    per_hop = max(t_tree - t_root, 0.0) / depth
    pods, wide, hops = 1_000, 50, 2
    t_1000 = t_root + hops * per_hop * wide / fanout
    t_store = t_all / children * pods
    return Row(
        f"{case}: on paper, {pods:,} pods at fanout {wide} ({hops} hops)",
        f"every pod from the store ~{t_store:.1f} s, {pods}x the data",
        f"~{t_1000:.1f} s, 1x the data", t_store / t_1000, "(info)", None,
        f"root's store read {t_root:.2f} s + {hops} x {per_hop:.2f} s per hop x {wide}/{fanout}",
    )  # fmt: skip


def broadcast(
    tmp: Path, big: int, files: int, file_size: int, children: int, fanout: int,
    rtt_ms: float, total_mbps: float,
) -> list[Row]:  # fmt: skip
    big_what = f"one {big >> 20} MiB key" if big < 1 << 30 else f"one {big >> 30} GiB key"
    many_what = f"{files:,} x {file_size >> 10} KiB files"
    with fake_gcs(on_disk=True) as endpoint:
        if endpoint is None:
            why = "no fake-gcs-server"
            return [Row.skipped(f"broadcast {w}", why) for w in (big_what, many_what)]
        bucket = f"bcast-{os.getpid()}"
        _client(endpoint).create_bucket(bucket)
        keys = KeyStore(GcsStore(bucket, client=_client(endpoint)))
        src, out = tmp / "bcast-src", tmp / "bcast-out"
        out.mkdir(parents=True)
        link = f"{rtt_ms:g} ms RTT, {total_mbps:g} MB/s shared"
        proxy = Proxy(endpoint, rtt_ms, total_mbps)
        group = None
        try:
            group = Children(proxy.url, bucket, children)
            rows: list[Row] = []
            for key, what, make in (
                ("bench/big", big_what, lambda p: cases_hash.make_big_file(p, big)),
                ("bench/files", many_what, lambda p: cases_hash.make_tree(p, files, file_size)),
            ):
                make(src)
                size = keys.put(key, src)["size"]
                shutil.rmtree(src) if src.is_dir() else src.unlink()
                rows += _one(proxy, group, key, size, out, fanout, link, what)
                print(f"broadcast {what} done", flush=True)
        finally:
            if group is not None:
                group.close()
            proxy.close()
            shutil.rmtree(out, ignore_errors=True)
    return rows
