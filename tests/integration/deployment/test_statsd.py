"""Kinetic's metrics as a StatsD server receives them from a real ``dag.test()``.

Airflow's stats client reads ``[metrics]`` when it is made, so the DAG runs in a fresh
process with StatsD on and pointed at a UDP socket this test holds on 127.0.0.1; the
client's packets are the evidence.  ``statsd_influxdb_enabled`` puts the tags into the
names (``name,key=value:1|c``); plain StatsD would drop them.  The local backend runs
a ``KineticRunOperator`` on a Data input (sync) and a two-input map, twice: the second
run's Data is a data cache hit.  Names carry Airflow's ``statsd_prefix`` (``airflow``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.local_conn import conn_env, local_extra

REPO = Path(__file__).resolve().parents[3]
SLEEP_S = 1.0
MARK = "kinetic_statsd_test.run_done"
DAG_ID = "kinetic_statsd"
PREFIX = "airflow.kinetic."

DAG_FILE = textwrap.dedent(
    f'''
    """Metrics test DAG (written by tests/integration/deployment/test_statsd.py, removed after)."""
    import datetime
    import os
    import time

    from airflow.sdk import DAG

    from airflow_provider_kinetic import Data, KineticMapOperator, KineticRunOperator


    def count(folder):
        time.sleep({SLEEP_S})
        return sorted(os.listdir(folder))


    def square(i):
        time.sleep({SLEEP_S})
        return i * i


    with DAG("{DAG_ID}", schedule=None, catchup=False,
             start_date=datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)) as dag:
        data = Data(os.environ.get("KINETIC_STATSD_DATA", os.path.dirname(__file__)))
        KineticRunOperator(task_id="count", python_callable=count, op_args=[data],
                           kinetic_conn_id="kinetic_statsd", poll_interval=0.2)
        KineticMapOperator(task_id="squares", python_callable=square, inputs=[1, 2],
                           kinetic_conn_id="kinetic_statsd", poll_interval=0.2)
    '''
)

RUNNER = textwrap.dedent(
    f"""
    import datetime, importlib.util, socket, sys
    spec = importlib.util.spec_from_file_location("kinetic_statsd_dag", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mark = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for day in (1, 2):
        when = datetime.datetime(2026, 11, day, tzinfo=datetime.timezone.utc)
        dr = module.dag.test(logical_date=when)
        print("STATE", day, dr.state, flush=True)
        mark.sendto(b"{MARK}:%d|c" % day, ("127.0.0.1", int(sys.argv[2])))
    """
)


def parse(line: str) -> tuple[str, dict[str, str], float, str]:
    """``name,k=v,...:value|type`` -> (name, tags, value, type)."""
    head, _, rest = line.rpartition(":")
    value, kind = rest.split("|")[:2]
    name, *pairs = head.split(",")
    return name, dict(p.split("=", 1) for p in pairs), float(value), kind


class Receiver:
    """A StatsD server in a thread: every line it was sent, in order."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(line for line in packet.decode().splitlines() if line)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def runs(lines: list[str]) -> list[list[tuple[str, dict[str, str], float, str]]]:
    """Kinetic's metrics per DAG run (split at the runner's marks)."""
    out: list[list[tuple[str, dict[str, str], float, str]]] = [[]]
    for line in lines:
        if line.startswith(MARK):
            out.append([])
        elif line.startswith(PREFIX):
            out[-1].append(parse(line))
    return out[:-1]


def named(run: list, name: str, **tags: str) -> list[tuple[dict[str, str], float, str]]:
    return [
        (t, v, k)
        for n, t, v, k in run
        if n == PREFIX + name and all(t.get(key) == val for key, val in tags.items())
    ]


def test_a_dag_run_sends_kinetic_metrics_with_tags(airflow_home, receiver, tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    sizes = {"a.bin": 3000, "b.txt": 17, "sub/c.bin": 1024}
    for rel, size in sizes.items():
        (data / rel).write_bytes(os.urandom(size))
    dag_path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "kinetic_statsd_test_dag.py"
    dag_path.write_text(DAG_FILE)
    script = tmp_path / "run_dag.py"
    script.write_text(RUNNER)
    env = {
        **os.environ,
        **conn_env("kinetic_statsd", local_extra(tmp_path / "k")),
        "PYTHONPATH": str(REPO),
        "KINETIC_STATSD_DATA": str(data),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(receiver.port),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    }
    try:
        out = subprocess.run([sys.executable, str(script), str(dag_path), str(receiver.port)],
                             capture_output=True, text=True, timeout=400, env=env)  # fmt: skip
    finally:
        dag_path.unlink()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "STATE 1 success" in out.stdout and "STATE 2 success" in out.stdout, out.stdout
    first, second = runs(receiver.lines)

    # The Data input: uploaded whole on the first run (a miss), a hit on the second.
    count = {"dag_id": DAG_ID, "task_id": "count"}
    assert [v for _, v, _ in named(first, "data.cache_misses", **count)] == [1]
    assert [v for _, v, _ in named(first, "data.uploaded_bytes", **count)] == [sum(sizes.values())]
    assert [v for _, v, _ in named(first, "data.uploaded_files", **count)] == [len(sizes)]
    assert named(first, "data.cache_hits") == []
    assert [v for _, v, _ in named(second, "data.cache_hits", **count)] == [1]
    assert named(second, "data.cache_misses") == [] and named(second, "data.uploaded_bytes") == []

    for run in (first, second):
        # The single job: ended once, its times as timers (ms), its result's size.
        job = {**count, "kind": "job", "backend": "local", "accelerator": "cpu"}
        ((tags, ended, kind),) = named(run, "job.ended", **job)
        assert (ended, kind, tags["state"], tags["capacity"]) == (1, "c", "SUCCEEDED", "on-demand")
        ((_, queued, kind),) = named(run, "job.queued", **job)
        assert kind == "ms" and queued >= 0
        ((_, ran, kind),) = named(run, "job.run", **job)
        assert kind == "ms" and ran >= SLEEP_S * 1000
        ((_, size, kind),) = named(run, "job.result_bytes", **count)
        assert kind == "c" and size > 0

        # The map: one batch of two children, each child's result counted.
        squares = {"dag_id": DAG_ID, "task_id": "squares"}
        ((tags, ended, _),) = named(run, "job.ended", **squares, kind="batch")
        assert ended == 2 and tags["backend"] == "local" and tags["state"] == "SUCCEEDED"
        ((_, ran, _),) = named(run, "job.run", **squares, kind="batch")
        assert ran >= SLEEP_S * 1000  # the mean per child
        assert len(named(run, "job.result_bytes", **squares)) == 2

        # Nothing was preempted, no capacity step, no API retry on the local backend.
        for name in ("job.preemptions", "job.capacity_steps", "k8s.api_retries"):
            assert named(run, name) == []
        # Every kinetic metric is tagged with its task.
        assert all(t.get("dag_id") == DAG_ID and t.get("task_id") for _, t, _, _ in run)
