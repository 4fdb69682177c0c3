"""DAGs timed by ``benchmarks/cases_overhead.py`` (copied into a private DAGs folder).

One task per DAG, so each ``dag.test()`` run times one kind of task and nothing else;
the functions are trivial so that what is measured is the task's machinery.
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG, task

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

START = pendulum.datetime(2026, 11, 1, tz="UTC")


def one() -> int:
    """The trivial function: what is left of the task time is overhead."""
    return 1


def seven_seconds() -> int:
    """Long enough that a deferrable task really defers (``DEFER_GRACE_S`` is 5 s)."""
    import time

    time.sleep(7.0)
    return 1


def seven_seconds_timed() -> int:
    """``seven_seconds``, writing when it started and ended into its output dir: the
    task's time splits into before the function, the function, and after it."""
    import json
    import os
    import time

    start = time.time()
    time.sleep(7.0)
    path = os.path.join(os.environ["KINETIC_OUTPUT_DIR"], "times.json")
    with open(path, "w") as f:
        json.dump({"start": start, "end": time.time()}, f)
    return 1


#: Airflow's own deferral of 7 s, counted from the task's start: the target is rendered
#: when the task starts (``TimeDeltaSensor`` counts from the run's data interval end
#: instead, which is before the task starts).
SEVEN_S_FROM_START = (
    "{{ macros.datetime.utcfromtimestamp(macros.time.time() + 7.0).isoformat() }}+00:00"
)


with DAG("overhead_plain", schedule=None, start_date=START, catchup=False) as plain_dag:

    @task
    def plain() -> int:
        return 1

    plain()

with DAG("overhead_plain_7s", schedule=None, start_date=START, catchup=False) as plain_7s_dag:

    @task
    def plain_7s() -> int:
        return seven_seconds()

    plain_7s()

with DAG("overhead_sync", schedule=None, start_date=START, catchup=False) as sync_dag:
    KineticRunOperator(task_id="job", python_callable=one, deferrable=False)

with DAG("overhead_deferrable", schedule=None, start_date=START, catchup=False) as deferrable_dag:
    KineticRunOperator(task_id="job", python_callable=one, deferrable=True)

with DAG("overhead_deferred_7s", schedule=None, start_date=START, catchup=False) as deferred_7s_dag:
    KineticRunOperator(task_id="job", python_callable=seven_seconds_timed, deferrable=True)

with DAG("overhead_airflow_defer_7s", schedule=None, start_date=START, catchup=False) as af_dag:
    # The standard provider's deferrable sensor: defer(), DateTimeTrigger, resume.
    DateTimeSensorAsync(task_id="wait", target_time=SEVEN_S_FROM_START)


#: The sweep case: children, slots and poll interval (``cases_overhead.sweep_row``).
SWEEP_INPUTS, SWEEP_SLOTS, SWEEP_POLL_S = 6, 2, 2.0


def timed_child(seconds: float) -> float:
    """Sleeps ``seconds``; writes its own start and end times into its output dir, so
    the benchmark sees when each child held a slot."""
    import json as _json
    import os as _os
    import time as _time

    start = _time.time()
    _time.sleep(seconds)
    path = _os.path.join(_os.environ["KINETIC_OUTPUT_DIR"], "times.json")
    with open(path, "w") as f:
        _json.dump({"start": start, "end": _time.time()}, f)
    return seconds


with DAG("overhead_sweep", schedule=None, start_date=START, catchup=False) as sweep_dag:
    # Children outlast the operator's watch (DEFER_GRACE_S), so the batch defers and
    # its trigger launches the later children: their waits for a slot are measured.
    KineticMapOperator(
        task_id="sweep",
        python_callable=timed_child,
        inputs=[6.0 + (i % 3) for i in range(SWEEP_INPUTS)],
        max_concurrent=SWEEP_SLOTS,
        poll_interval=SWEEP_POLL_S,
        deferrable=True,
    )
