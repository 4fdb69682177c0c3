"""KineticMapOperator's ``retries`` is the task's Airflow retries, as on every operator;
per-input retries are ``input_retries``.

The run itself (default_args retries + input_retries through ``dag.test()``) is
tests/integration/test_first_hour.py."""

from __future__ import annotations

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_kinetic import KineticMapOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def double(x: int) -> int:
    return 2 * x


def sweep(dag: DAG, task_id: str, **kwargs) -> KineticMapOperator:
    return KineticMapOperator(
        task_id=task_id, python_callable=double, inputs=[1, 2], dag=dag, **kwargs
    )


def test_default_args_retries_are_the_tasks():
    with DAG("d", schedule=None, start_date=START, default_args={"retries": 3}) as dag:
        op = sweep(dag, "a")
        per_input = sweep(dag, "b", input_retries=2)
    assert (op.retries, op.input_retries) == (3, 0)
    assert (per_input.retries, per_input.input_retries) == (3, 2)


def test_an_explicit_retries_is_the_tasks():
    dag = DAG("d", schedule=None, start_date=START, default_args={"retries": 5})
    op = sweep(dag, "a", retries=2)
    assert (op.retries, op.input_retries) == (2, 0)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_input_retries_fail_at_parse_naming_the_value(bad):
    dag = DAG("d", schedule=None, start_date=START)
    with pytest.raises(ValueError, match=rf"input_retries .* integer >= 0, got {bad!r}"):
        sweep(dag, "a", input_retries=bad)
