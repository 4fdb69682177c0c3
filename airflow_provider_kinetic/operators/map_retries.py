"""What ``retries`` means on KineticMapOperator: the task's Airflow retries.

On every Airflow operator ``retries`` (and ``default_args={"retries": 2}``) is the
task's; earlier versions of the map operator read it as per-input retries, so a DAG's
``default_args`` silently became a per-input budget and the task itself never
retried.  Per-input retries are ``input_retries`` now.  For one release an explicit
``retries=`` (or ``task_retries=``, the old name of the task's retries) logs
:data:`RETRIES_CHANGED`, so a DAG written for the old meaning is noticed.

``retries`` is not a parameter of the operator's ``__init__``: Airflow fills the
parameters a class names from ``default_args``, so only a ``retries`` the DAG author
wrote reaches ``kwargs`` there, and ``default_args`` reach ``BaseOperator`` as usual.
"""

from __future__ import annotations

from typing import Any

RETRIES_CHANGED = (
    "KineticMapOperator: %s=%r is the task's Airflow retries (as on every operator): a "
    "failed try of the task runs again, resuming its batch. Earlier versions read it as "
    "per-input retries; for those write input_retries=%r. (This warning goes away in "
    "the next release.)"
)


def renamed_retries(kwargs: dict[str, Any]) -> str | None:
    """Which retries argument the DAG wrote (``retries``, ``task_retries``), if any;
    ``task_retries`` is moved to ``retries`` in ``kwargs``.  Both at once is an error."""
    if "task_retries" not in kwargs:
        return "retries" if "retries" in kwargs else None
    task_retries = kwargs.pop("task_retries")
    if "retries" in kwargs:
        raise ValueError(
            f"KineticMapOperator got retries={kwargs['retries']!r} and "
            f"task_retries={task_retries!r}: task_retries is the old name of retries (the "
            "task's Airflow retries); give one of them, and per-input retries as input_retries"
        )
    kwargs["retries"] = task_retries
    return "task_retries"


def check_input_retries(value: Any) -> int:
    """``input_retries`` as an int >= 0, else an error naming the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"input_retries (re-submissions of a failed input) must be an integer >= 0, "
            f"got {value!r}"
        )
    return value
