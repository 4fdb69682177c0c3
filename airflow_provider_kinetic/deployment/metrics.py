"""Airflow's own stats client as the sink of ``core.metrics``.

Going through Airflow's client (not a StatsD socket of our own) means the metrics
follow the deployment's ``[metrics]`` settings: StatsD, Datadog or OpenTelemetry, the
prefix (``statsd_prefix`` / ``otel_prefix``, ``airflow`` by default, so names read
``airflow.kinetic.job.run``), allow and block lists, disabled tags.  The client is the
one ``airflow.providers.common.compat.sdk.Stats`` names on every supported Airflow:
Airflow 3.1's ``airflow.stats.Stats`` (it configures itself from ``[metrics]`` on first
use) and, from 3.2, the Task SDK's ``airflow.sdk.observability.stats`` (configured by
``initialize()``, which the task runner and the triggerer call at start-up).

Importing this module only registers :func:`resolve` with ``core.metrics``: nothing
Airflow is imported until the first metric of a process, and then once.  With
``[metrics] statsd_on``, ``otel_on`` and ``statsd_datadog_enabled`` all off, the sink is
``None`` and every core call stays a no-op; no client is made.  A process where metrics
are on but Airflow's stats were never initialized (``dag.test()``, which runs tasks in
the test's own process) is initialized the way the task runner does it.

Tags: ``dag_id`` and ``task_id`` always (a metric outside a task run, e.g. from the CLI
or the Kinetic page, is not sent), ``accelerator`` (catalog name: ``cpu``,
``gpu-l4x1``, ``tpu-v6e-8``), ``backend`` (``local``, ``gke``) where known, and the call
site's own (``capacity``, ``state``, ``kind``...).  They come from the call, over the
trigger's scope (:func:`trigger_scope`), over the running task's context.  Airflow's
StatsD client sends tags only when ``[metrics] statsd_influxdb_enabled`` is on (as
``name,key=value``) or with Datadog; plain StatsD drops them; OpenTelemetry makes them
attributes.  Tag values are reduced to the characters StatsD names allow.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

from airflow_provider_kinetic.core import metrics as core_metrics

log = logging.getLogger(__name__)

#: Any one of these on: Airflow's stats client is made and metrics are sent.
SWITCHES = ("statsd_on", "otel_on", "statsd_datadog_enabled")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def metrics_on() -> bool:
    """Whether ``[metrics]`` sends anything (StatsD, Datadog or OpenTelemetry)."""
    from airflow.providers.common.compat.sdk import conf

    return any(conf.getboolean("metrics", key, fallback=False) for key in SWITCHES)


def resolve() -> AirflowStatsSink | None:
    """The sink for this process, or None when ``[metrics]`` sends nothing (then no
    client is made).  ``core.metrics`` calls it once, on the first metric."""
    if not metrics_on():
        return None
    from airflow.providers.common.compat.sdk import Stats

    _initialize(Stats)
    return AirflowStatsSink(Stats)


def _initialize(stats: Any) -> None:
    """Airflow 3.2+: initialize the Task SDK's stats where nobody did (``dag.test()``
    runs tasks in the calling process, where the task runner's ``initialize`` never
    ran; uninitialized, it is a no-op logger).  Initialized already, or Airflow 3.1 (a
    client that configures itself): nothing to do.  Whether it was initialized is only
    visible in the module's ``_factory``."""
    module = sys.modules.get(getattr(getattr(stats, "initialize", None), "__module__", "") or "")
    if module is None or getattr(module, "_factory", True) is not None:
        return
    from airflow.providers.common.compat.sdk import conf

    try:
        from airflow.sdk.observability.metrics import stats_utils

        legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=legacy)
    except (ImportError, TypeError) as exc:  # another Airflow's signature: send via its own
        log.debug("Airflow's stats left as they are: %s", exc)


@functools.lru_cache(maxsize=64)
def accelerator_tag(spec: str) -> str:
    """The catalog name a person reads (``gpu-l4`` -> ``gpu-l4x1``), as usage says it."""
    from airflow_provider_kinetic.core.jobs.usage import accelerator_facts

    return str(accelerator_facts(spec or "cpu")["accelerator"])


def _task_tags() -> dict[str, str]:
    """dag_id, task_id, accelerator and backend of the Airflow task running in this
    process, or {} outside one (the triggerer, the CLI)."""
    try:
        from airflow.sdk import get_current_context

        context = get_current_context()
    except Exception:  # noqa: BLE001 - no task here
        return {}
    ti, task = context.get("ti"), context.get("task")
    if ti is None:
        return {}
    tags = {"dag_id": str(ti.dag_id), "task_id": str(ti.task_id)}
    spec = getattr(task, "accelerator_spec", None)
    if callable(spec):
        tags["accelerator"] = accelerator_tag(spec())
    backend = getattr(getattr(task, "_backend", None), "name", None)  # set once execute has it
    if isinstance(backend, str):
        tags["backend"] = backend
    return tags


class AirflowStatsSink:
    """``core.metrics.Sink`` on Airflow's ``Stats``: names as given, timings in
    milliseconds (what StatsD and Airflow's OpenTelemetry logger take), tags merged
    and cleaned.  A metric without a task (no ``dag_id``) is not sent."""

    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def _final(self, tags: Mapping[str, str]) -> dict[str, str] | None:
        given = {key: value for key, value in tags.items() if value}
        merged = given if "dag_id" in given else {**_task_tags(), **given}
        if not merged.get("dag_id"):
            return None
        return {key: _UNSAFE.sub("_", str(value)) for key, value in merged.items()}

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        final = self._final(tags)
        if final is not None:
            self._stats.incr(name, count, tags=final)

    def timing(self, name: str, seconds: float, tags: Mapping[str, str]) -> None:
        final = self._final(tags)
        if final is not None:
            self._stats.timing(name, seconds * 1000.0, tags=final)

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        final = self._final(tags)
        if final is not None:
            self._stats.gauge(name, value, tags=final)


def trigger_scope(
    trigger: Any, identity: Mapping[str, Any] | None, accelerator: str, backend: str
) -> None:
    """Tag what a trigger's ``run()`` emits (its asyncio task, and the threads it starts
    with ``asyncio.to_thread``) with its task: ids from ``identity`` (a batch's
    template) or the trigger's task instance, the job's accelerator and backend.  With
    metrics off (after the first check), nothing is done.  Never raises: it runs inside
    a trigger, which must not fail for a metric."""
    try:
        if not core_metrics.enabled():
            return
        ti = getattr(trigger, "task_instance", None)
        ids = identity or {}
        dag_id = ids.get("dag_id") or getattr(ti, "dag_id", None)
        task_id = ids.get("task_id") or getattr(ti, "task_id", None)
        tags = {"accelerator": accelerator_tag(accelerator), "backend": backend}
        if dag_id and task_id:
            tags.update(dag_id=str(dag_id), task_id=str(task_id))
        core_metrics.set_scope(tags)
    except Exception as exc:  # noqa: BLE001 - metrics never fail a trigger
        log.debug("kinetic metrics scope not set: %s", exc)


core_metrics.set_resolver(resolve)
