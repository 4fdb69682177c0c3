"""The work digest: equal work gives equal digests in any process; other code, other
inputs or other options give other digests (``core.jobs.work``)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from airflow_provider_kinetic.core.jobs.work import call_digest, code_digest, stable_bytes

REPO = Path(__file__).resolve().parents[4]

SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys
    from airflow_provider_kinetic.core.jobs.work import call_digest

    @dataclasses.dataclass
    class Config:  # a class defined in the "DAG file": pickled by name here
        lr: float
        tags: set

    LABELS = {"alpha", "beta", "gamma", "delta", "epsilon"}

    def train(config, labels=LABELS):
        return sorted(labels), config.lr

    args = (Config(0.1, {"x", "y", "z", "w"}),)
    kwargs = {"labels": frozenset({"p", "q", "r", "s"}), "steps": {3, 1, 2}}
    print(call_digest(train, args, kwargs, [], {"KINETIC_OUTPUT_DIR": "/o"}))
    """
)


def digest_in_new_process(tmp_path: Path, seed: str, source: str = SCRIPT) -> str:
    script = tmp_path / "dag.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def test_equal_work_gives_one_digest_in_any_process(tmp_path):
    """String sets iterate in another order under another hash seed: same digest."""
    digests = {digest_in_new_process(tmp_path, seed) for seed in ("0", "1", "2", "12345")}
    assert len(digests) == 1


def test_other_code_or_inputs_give_other_digests(tmp_path):
    base = digest_in_new_process(tmp_path, "1")
    fixed = SCRIPT.replace(
        "return sorted(labels), config.lr", "return sorted(labels), 2 * config.lr"
    )
    assert digest_in_new_process(tmp_path, "1", fixed) != base
    other_input = SCRIPT.replace("Config(0.1,", "Config(0.2,")
    assert digest_in_new_process(tmp_path, "1", other_input) != base


def _f(a, b=1):  # noqa: ANN001, ANN202
    return a + b


def test_what_a_callable_carries_counts():
    assert code_digest(functools.partial(_f, 1)) != code_digest(functools.partial(_f, 2))
    assert code_digest(functools.partial(_f, 1)) == code_digest(functools.partial(_f, 1))

    def make(scale):  # noqa: ANN001, ANN202
        return lambda x: x * scale

    assert code_digest(make(2)) != code_digest(make(3))
    assert call_digest(_f, (1,), {}, [], {}) != call_digest(_f, (2,), {}, [], {})
    assert call_digest(_f, (1,), {}, [], {"A": "1"}) != call_digest(_f, (1,), {}, [], {"A": "2"})


def test_sets_are_serialised_in_one_order():
    assert stable_bytes({"b", "a", "c"}) == stable_bytes({"c", "b", "a"})
    assert stable_bytes(frozenset({1, 2})) != stable_bytes({1, 2})


HELPERS = textwrap.dedent(
    """
    import sys
    from airflow_provider_kinetic.core.jobs.work import call_digest

    SCALE = 10

    def helper(x):
        return x * SCALE

    def unrelated():
        return "not called by the task"

    class Model:
        def fit(self, x):
            return helper(x)

    def task(x):
        return Model().fit(x)

    print(call_digest(task, (1,), {}, [], {}))
    """
)


def test_the_code_a_task_reaches_counts_and_the_rest_of_the_file_does_not(tmp_path):
    """A fix in a helper the task calls (or a constant it reads, or a method of a class
    it uses) is other work; an edit elsewhere in the DAG file is not."""
    base = digest_in_new_process(tmp_path, "0", HELPERS)
    assert digest_in_new_process(tmp_path, "1", HELPERS) == base
    changed = {
        "helper": HELPERS.replace("return x * SCALE", "return x * SCALE + 1"),
        "constant": HELPERS.replace("SCALE = 10", "SCALE = 11"),
        "method": HELPERS.replace("return helper(x)", "return helper(x) - 1"),
    }
    for what, source in changed.items():
        assert digest_in_new_process(tmp_path, "0", source) != base, what
    unrelated = HELPERS.replace('"not called by the task"', '"edited"')
    assert digest_in_new_process(tmp_path, "0", unrelated) == base
