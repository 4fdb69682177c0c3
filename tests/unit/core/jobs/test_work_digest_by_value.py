"""The work digest sees the code the payload ships by value (``core.jobs.work``).

Each digest is taken in a fresh process (its own hash seed, its own class tracker
ids), from a "DAG file" with a helper module beside it under the by-value root, as
a task's worker would: an unchanged DAG gives one digest in every process; a change
to any code the payload carries by value gives another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]

HELPERS = textwrap.dedent(
    """
    FACTOR = 3

    def scale(x):
        return x * FACTOR
    """
)

DAG = textwrap.dedent(
    """
    import enum, functools, sys
    import cloudpickle
    sys.path.insert(0, sys.argv[1])
    import helpers
    cloudpickle.register_pickle_by_value(helpers)  # what by_value_roots does for a worker
    from airflow_provider_kinetic.core.jobs.work import call_digest

    def logged(f):
        @functools.wraps(f)
        def wrapper(*a, **k):
            return f(*a, **k)
        return wrapper

    class Mode(enum.Enum):
        FAST = "fast"

    class Model:
        OFFSET = 1
        def fit(self, x):
            return x + self.OFFSET

    def default_step(x):
        return x - 1

    @logged
    def child(x, step=default_step):
        return helpers.scale(Model().fit(step(x))), Mode.FAST, {"a", "b", "c", "d"}

    print(call_digest(child, (1,), {}, [], {}))
    """
)


def digest(tmp_path: Path, seed: str, dag: str = DAG, helpers: str = HELPERS) -> str:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "helpers.py").write_text(helpers)
    (project / "dag.py").write_text(dag)
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, str(project / "dag.py"), str(project)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return out.stdout.strip()


def test_unchanged_code_gives_one_digest_in_every_process(tmp_path):
    """Sets, interned strings, enum and class tracker ids differ between processes."""
    assert len({digest(tmp_path, seed) for seed in ("0", "1", "77")}) == 1


def test_a_line_moved_by_an_edit_elsewhere_is_the_same_work(tmp_path):
    base = digest(tmp_path, "0")
    moved = DAG.replace("class Mode(enum.Enum):", "# a comment\n\n\nclass Mode(enum.Enum):")
    assert digest(tmp_path, "0", moved) == base


def test_every_change_to_code_shipped_by_value_is_other_work(tmp_path):
    """The decorated function's body (reached through the wrapper's closure), a
    helper module's function and constant read as ``helpers.scale``, a class
    attribute, a function given as a default, an enum member."""
    base = digest(tmp_path, "0")
    dag_changes = {
        "decorated body": ("return helpers.scale(", "return 1 + helpers.scale("),
        "class attribute": ("OFFSET = 1", "OFFSET = 2"),
        "default function": ("return x - 1", "return x - 2"),
        "enum member": ('FAST = "fast"', 'FAST = "faster"'),
    }
    for what, (old, new) in dag_changes.items():
        assert old in DAG, what
        assert digest(tmp_path, "0", DAG.replace(old, new)) != base, what
    for what, (old, new) in {
        "helper body": ("return x * FACTOR", "return x * FACTOR + 1"),
        "helper constant": ("FACTOR = 3", "FACTOR = 4"),
    }.items():
        assert digest(tmp_path, "0", helpers=HELPERS.replace(old, new)) != base, what
