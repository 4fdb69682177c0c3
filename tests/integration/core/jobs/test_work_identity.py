""" "The same work" is one digest of everything that runs (docs/ARCHITECTURE.md,
"Identity and liveness").

Each try is a real task execution in its own Python process (a fake task instance),
against one real local store; jobs are real local jobs with real runners.

- A fix of a *decorated* function's body (the function sits in the decorator's
  closure) is other work: a map task starts a new batch, a single task does not
  adopt the old job; an unchanged retry still adopts.
- A new batch never restores another batch's checkpoint of the same input index.
- A try owns its output: a crashed try's files are not in the key the retry
  publishes.
- Keys move forward: a run of an older logical date finishing last keeps its
  version aside (``output_key_policy="last_finisher"``: the last finisher wins).
"""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.jobs.taskrecord import read_record
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.storage import LocalStore
from airflow_provider_kinetic.deployment.signing import deployment_secret
from tests.fixtures import task_process
from tests.fixtures.local_conn import set_local_conn
from tests.fixtures.task_process import finish
from tests.fixtures.waiting import wait_for

PRELUDE = textwrap.dedent(
    """
    import functools, json, os, sys, time
    from datetime import UTC, datetime
    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

    ARGS = json.loads(sys.argv[1])

    class TI:
        dag_id, map_index = "ident", -1
        run_id, task_id, try_number = ARGS["run_id"], ARGS["task_id"], ARGS["try"]
        def __init__(self):
            self.start_date = datetime.now(UTC)
        def xcom_push(self, key, value):
            print("XCOM", key, json.dumps(value), flush=True)

    def context():
        when = ARGS.get("logical_date")
        return {"ti": TI(), "logical_date": datetime.fromisoformat(when) if when else None}

    def count(marker):
        with open(marker, "a") as f:
            f.write("ran\\n")
        while os.path.exists(marker + ".hold"):  # the test releases the job
            time.sleep(0.05)  # timing-ok: the job's workload, held until the test releases it

    def logged(f):  # a user's decorator: the task's function is in its closure
        @functools.wraps(f)
        def wrapper(*a, **k):
            return f(*a, **k)
        return wrapper
    """
)

MAP_V1 = """
@logged
def child(marker, x):
    count(f"{marker}-{x}")
    if x == 2:
        raise ValueError("the bug: input 2 fails")
    return x * 10
"""
MAP_V2 = (
    MAP_V1.replace('        raise ValueError("the bug: input 2 fails")\n', "")
    .replace("    if x == 2:\n", "")
    .replace("x * 10", "x * 100")
)

MAP_TASK = """
op = KineticMapOperator(
    task_id=ARGS["task_id"], python_callable=child,
    inputs=[{"marker": ARGS["marker"], "x": x} for x in ARGS["inputs"]],
    kinetic_conn_id="kinetic_ident", poll_interval=0.1, max_concurrent=4,
)
print("RESULT", json.dumps(op.execute(context())), flush=True)
"""

SINGLE = """
@logged
def work(marker):
    count(marker)
    return "v1"

op = KineticRunOperator(
    task_id=ARGS["task_id"], python_callable=work, op_args=[ARGS["marker"]],
    kinetic_conn_id="kinetic_ident", poll_interval=0.1,
)
print("RESULT", json.dumps(op.execute(context())), flush=True)
"""

CHECKPOINTED = """
def child(flags, x):
    saved = os.path.join(os.environ["KINETIC_CHECKPOINT_DIR"], "value")
    if os.path.exists(saved):
        with open(saved) as f:
            return ["restored", f.read()]
    with open(saved, "w") as f:
        f.write(str(x))
    if os.path.exists(os.path.join(flags, f"fail-{x}")):
        raise RuntimeError(f"input {x} fails after its checkpoint")
    return ["fresh", str(x)]

op = KineticMapOperator(
    task_id=ARGS["task_id"], python_callable=child,
    inputs=[{"flags": ARGS["flags"], "x": x} for x in ARGS["inputs"]],
    kinetic_conn_id="kinetic_ident", poll_interval=0.1, checkpoint_sync_s=600,
)
print("RESULT", json.dumps(op.execute(context())), flush=True)
"""

PUBLISHING = """
def train(name, crash):
    out = os.environ["KINETIC_OUTPUT_DIR"]
    with open(os.path.join(out, name), "w") as f:
        f.write(name)
    if crash:
        raise RuntimeError("the try crashes after writing a shard")
    return name

op = KineticRunOperator(
    task_id=ARGS["task_id"], python_callable=train,
    op_args=[ARGS["file"], ARGS.get("crash", False)],
    kinetic_conn_id="kinetic_ident", poll_interval=0.1, output_key="models/m",
)
if ARGS.get("policy"):
    op.output_key_policy = ARGS["policy"]
print("RESULT", json.dumps(op.execute(context())), flush=True)
"""


@pytest.fixture
def root(monkeypatch, tmp_path) -> Path:
    return set_local_conn(monkeypatch, tmp_path / "kinetic", "kinetic_ident", "kinetic_default")


def start(tmp_path: Path, body: str, name: str, **args) -> subprocess.Popen:  # noqa: ANN003
    args.setdefault("try", 1)
    return task_process.start(tmp_path, PRELUDE + textwrap.dedent(body), name, **args)


def runs(marker: Path | str) -> int:
    marker = Path(marker)
    return marker.read_text().count("ran") if marker.exists() else 0


def ident(run_id: str, task_id: str) -> dict:
    return {"dag_id": "ident", "run_id": run_id, "task_id": task_id, "map_index": -1}


def test_a_fixed_decorated_map_function_starts_a_new_batch(tmp_path, root):
    marker = tmp_path / "child"
    common = {"run_id": "manual__m", "task_id": "sweep", "inputs": [1, 2, 3], "marker": str(marker)}
    _, out = finish(start(tmp_path, MAP_V1 + MAP_TASK, "m1", **common), ok=False)
    assert "the bug: input 2 fails" in out
    # The fix is in the decorated function's body; the task is cleared.
    value, out = finish(start(tmp_path, MAP_V2 + MAP_TASK, "m2", **common, **{"try": 2}))
    assert "ran other work than this try's" in out and "starting a new batch" in out
    assert value == [100, 200, 300]  # the new code's values, none of the old batch's


def test_a_fixed_decorated_single_function_is_not_adopted_and_unchanged_is(tmp_path, root):
    store = LocalStore(str(root))
    for run_id, fixed in (("manual__fixed", True), ("manual__same", False)):
        marker = tmp_path / run_id
        Path(f"{marker}.hold").touch()
        args = {"run_id": run_id, "task_id": "t", "marker": str(marker)}
        first = start(tmp_path, SINGLE, f"{run_id}-1", **args)
        wait_for("the job to run", lambda m=marker: runs(m) == 1)
        first.send_signal(signal.SIGKILL)  # the worker dies; the job runs on
        first.wait(30)
        old = read_record(store, ident(run_id, "t"), deployment_secret()).job
        body = SINGLE.replace('return "v1"', 'return "v2"') if fixed else SINGLE
        second = start(tmp_path, body, f"{run_id}-2", **args, **{"try": 2})

        def decided(m: Path = marker, r: str = run_id, was: str = old.job_id) -> bool:
            record = read_record(store, ident(r, "t"), deployment_secret())
            return runs(m) == 2 or (record.try_number == 2 and record.job.job_id == was)

        wait_for("try 2 to submit or adopt", decided)
        Path(f"{marker}.hold").unlink()
        value, out = finish(second)
        if fixed:
            assert value == "v2" and runs(marker) == 2
            assert f"job {old.job_id} (RUNNING) ran other work than this try's" in out
        else:
            assert value == "v1" and runs(marker) == 1  # adopted: the function ran once


def test_a_new_batch_never_restores_another_batchs_checkpoint(tmp_path, root):
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "fail-1").touch()
    common = {"run_id": "manual__c", "task_id": "ck", "flags": str(flags)}
    _, out = finish(start(tmp_path, CHECKPOINTED, "c1", inputs=[1], **common), ok=False)
    assert "input 1 fails after its checkpoint" in out
    # The upstream now yields another input: other work, a new batch.
    value, out = finish(start(tmp_path, CHECKPOINTED, "c2", inputs=[5], **common, **{"try": 2}))
    assert "starting a new batch" in out
    assert value == [["fresh", "5"]]  # not input 1's value, from the old batch's slot
    assert "restored only from this work's" in out  # the default, said in the log


def test_the_key_holds_only_what_the_succeeding_try_wrote(tmp_path, root):
    common = {
        "run_id": "manual__o",
        "task_id": "train",
        "logical_date": "2024-01-01T00:00:00+00:00",
    }
    _, out = finish(
        start(tmp_path, PUBLISHING, "o1", file="shard.bin", crash=True, **common), False
    )
    assert "crashes after writing a shard" in out
    value, out = finish(start(tmp_path, PUBLISHING, "o2", file="model.bin", **common, **{"try": 2}))
    assert value == "model.bin"
    state = KeyStore(LocalStore(str(root))).state("models/m")
    assert state is not None and state.current.files == 1  # model.bin alone
    assert "files an earlier job left; removed them" in out


def test_keys_move_forward_in_logical_date(tmp_path, root):
    store = LocalStore(str(root))
    newer = {
        "run_id": "scheduled__02",
        "task_id": "train",
        "logical_date": "2024-01-02T00:00:00+00:00",
    }
    older = {
        "run_id": "scheduled__01",
        "task_id": "train",
        "logical_date": "2024-01-01T00:00:00+00:00",
    }
    finish(start(tmp_path, PUBLISHING, "k2", file="newer.bin", **newer))
    current = KeyStore(store).state("models/m").current.version
    _, out = finish(start(tmp_path, PUBLISHING, "k1", file="older.bin", **older))  # finishes last
    state = KeyStore(store).state("models/m")
    assert state.current.version == current  # the key did not move back
    assert len(state.versions) == 2  # the older run's version is kept and listed
    aside = state.versions[1]
    assert aside.by["run_id"] == "scheduled__01" and aside.by["logical_date"].startswith(
        "2024-01-01"
    )
    assert "kept aside, the key not moved" in out and "is before the current version's" in out
    # The old behaviour, asked for: the last finisher wins.
    last = {**older, "run_id": "scheduled__01b"}
    finish(start(tmp_path, PUBLISHING, "k3", file="last.bin", policy="last_finisher", **last))
    assert KeyStore(store).state("models/m").current.by["run_id"] == "scheduled__01b"
