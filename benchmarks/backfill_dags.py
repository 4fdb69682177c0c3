"""DAGs timed by ``benchmarks/cases_backfill.py`` under ``airflow standalone`` (copied into
its DAGs folder): a daily ``train`` over that date's Data directory, and a plain
``check`` task downstream that recomputes the date's value from the same files and
fails on any difference.  ``bench_backfill_cache`` reuses identical work
(``cache=True``: same code, arguments and Data contents); ``bench_backfill_nocache`` is
the same DAG without it, the baseline.  The data root comes in the backfill's run
conf."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_kinetic import Data, KineticRunOperator

START = pendulum.datetime(2026, 10, 1, tz="UTC")
#: The dates a backfill covers.
DAYS = 30


#: Seconds of "training" in each job (a cache hit skips them; the check does not pay them).
TRAIN_S = 2.0


def total(data_dir: str, ds: str) -> dict:
    """The date's value: the sum of the numbers in its files."""
    import os

    value = 0
    for name in sorted(os.listdir(data_dir)):
        with open(os.path.join(data_dir, name)) as f:
            value += sum(int(x) for x in f.read().split())
    return {"ds": ds, "score": value}


def score(data_dir: str, ds: str) -> dict:
    """The job: a training step's time, then the date's value."""
    import time

    time.sleep(TRAIN_S)
    return total(data_dir, ds)


for cached in (True, False):
    with DAG(
        f"bench_backfill_{'cache' if cached else 'nocache'}",
        schedule="@daily",
        start_date=START,
        end_date=START.add(days=DAYS - 1),
        catchup=False,
    ):
        train = KineticRunOperator(
            task_id="train",
            python_callable=score,
            op_args=[Data("{{ dag_run.conf['data_root'] }}/{{ ds }}/"), "{{ ds }}"],
            cache=cached,
            output_asset=False,
        )

        @task
        def check(value: dict, data_root: str, day: str) -> None:
            """Recompute the date's value from its files: the value must be this date's."""
            import os

            want = total(os.path.join(data_root, day), day)
            if value != want:
                raise ValueError(f"{day}: train returned {value}, the files say {want}")

        check(train.output, "{{ dag_run.conf['data_root'] }}", "{{ ds }}")
