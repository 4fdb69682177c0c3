"""Report a job's progress from inside its function::

    from airflow_provider_kinetic import progress

    def train(steps):
        for step in range(steps):
            loss = ...
            progress.update(step + 1, total=steps, metrics={"loss": loss})

The task log then shows ``step 1,200/10,000 (12%), ETA 41 min, loss 0.231`` when the
step or a metric changes, the task pushes the last update as XCom
``kinetic_progress``, and the ``kinetic.job.progress`` gauge says the percent done.
Updates are cheap to make every step: at most one store write every few seconds
(``KINETIC_PROGRESS_MIN_S``, default 5), the last one always written when the
function ends.  Outside a kinetic job ``update`` does nothing (one warning).

Importable in a pod without Airflow (the writer is ``core/jobs/progress_report.py``).
"""

from __future__ import annotations

from airflow_provider_kinetic.core.jobs.progress_report import update

__all__ = ["update"]
