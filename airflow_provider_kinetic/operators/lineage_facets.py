"""The OpenLineage side of ``operators/lineage.py``: Kinetic's facets and the
``OperatorLineage`` the OpenLineage provider wants.

Imported only from inside ``get_openlineage_facets_on_*`` (the provider calls them
only when it is installed), so this module may import ``openlineage`` and
``airflow.providers.openlineage`` at the top; nothing else in the package imports it.

The custom facets follow the client's rules: ``attrs`` classes deriving from its
``RunFacet`` / ``DatasetFacet`` (``_producer`` is this package, ``_schemaURL`` the base
facet's, as the Airflow provider's own facets do), camelCase fields, keys prefixed
``kinetic`` so they never meet another producer's.  A local dataset's version is also
said the standard way (``version``: ``DatasetVersionDatasetFacet``) so that lineage
tools that know no Kinetic facet still tell versions apart.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.openlineage.extractors import OperatorLineage
from attrs import define, field, fields
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    DatasetFacet,
    RunFacet,
    dataset_version_dataset,
    error_message_run,
)

from airflow_provider_kinetic.core.version import __version__
from airflow_provider_kinetic.operators.lineage_names import DataSet

#: The facets' ``_producer``: this package at this version.
PRODUCER = f"https://pypi.org/project/airflow-provider-kinetic/{__version__}/"
#: Facet keys: a run's, each dataset's.
RUN_FACET = "kinetic"
DATA_FACET = "kineticData"


@define
class KineticRunFacet(RunFacet):
    """The Kinetic job (or batch) behind an Airflow task run.

    Single jobs: ``jobId`` (this try's job, the ``kinetic_job`` XCom's) and ``jobIds``
    (every job of the task run: capacity fallbacks, preemptions).  Batches: ``groupId``,
    ``childJobCount``, the first ``childJobIds`` and the ``children`` counts.  Both:
    where it ran (``backend``, ``accelerator``, ``capacity``, ``image``), how it ended
    (``state``, ``reason``, and for a failed job ``failure``: its class, phase, exit
    code, host and remote exception, ``core.spec.failure``) and ``usage`` (the
    ``kinetic_usage`` summary).
    """

    connId: str | None = field(default=None)
    jobId: str | None = field(default=None)
    jobIds: list[str] | None = field(default=None)
    groupId: str | None = field(default=None)
    childJobCount: int | None = field(default=None)
    childJobIds: list[str] | None = field(default=None)
    children: dict[str, Any] | None = field(default=None)
    backend: str | None = field(default=None)
    accelerator: str | None = field(default=None)
    capacity: str | None = field(default=None)
    image: str | None = field(default=None)
    outputDir: str | None = field(default=None)
    state: str | None = field(default=None)
    reason: str | None = field(default=None)
    failure: dict[str, Any] | None = field(default=None)
    usage: dict[str, Any] | None = field(default=None)
    omittedInputs: int | None = field(default=None)

    # Ids, names and numbers: nothing the secrets masker should rewrite.
    _additional_skip_redact = ["jobId", "jobIds", "groupId", "childJobIds", "image", "usage"]


@define
class KineticDataDatasetFacet(DatasetFacet):
    """A dataset as the task named it: ``uri`` (the ``Data`` path or output dir),
    ``argument`` (where it sat), kinetic's ``contentHash`` of local data with
    ``hashedAt`` ("submit": the hash the job was packed with; "complete": hashed
    again when the event was made), and for ``hf://`` data its ``revision``,
    ``split`` and ``configName``."""

    uri: str = field()
    argument: str | None = field(default=None)
    contentHash: str | None = field(default=None)
    hashedAt: str | None = field(default=None)
    revision: str | None = field(default=None)
    split: str | None = field(default=None)
    configName: str | None = field(default=None)

    _additional_skip_redact = ["uri", "contentHash"]


def _facets(item: DataSet, extra: dict[str, str]) -> dict[str, Any]:
    facets: dict[str, Any] = {
        DATA_FACET: KineticDataDatasetFacet(
            uri=item.uri,
            argument=item.argument,
            contentHash=item.content_hash,
            hashedAt=item.hashed_at,
            producer=PRODUCER,
            **extra,
        )
    }
    version = item.content_hash or extra.get("revision")
    if version:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=version, producer=PRODUCER
        )
    return facets


#: ``(namespace, name, extra, DataSet)``: a dataset named by ``lineage_names.named``.
Named = tuple[str, str, dict[str, str], DataSet]


def to_operator_lineage(
    inputs: list[Named], outputs: list[Named], run: dict[str, Any], error: str | None
) -> OperatorLineage:
    """The provider's ``OperatorLineage`` of one event (a ``lineage.TaskLineage``, its
    datasets named; ``lineage`` imports this module, so it passes the parts)."""
    known = {a.name for a in fields(KineticRunFacet)}
    values = {k: v for k, v in run.items() if v is not None and k in known}
    run_facets: dict[str, Any] = {}
    if values:
        run_facets[RUN_FACET] = KineticRunFacet(producer=PRODUCER, **values)
    if error:
        # Airflow's own exception, when the listener has one, replaces it: both name
        # the job's error; the run facet keeps the job's state and reason either way.
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error, programmingLanguage="python", producer=PRODUCER
        )
    return OperatorLineage(
        inputs=[InputDataset(namespace=ns, name=n, facets=_facets(d, x)) for ns, n, x, d in inputs],
        outputs=[
            OutputDataset(namespace=ns, name=n, facets=_facets(d, x)) for ns, n, x, d in outputs
        ],
        run_facets=run_facets,
    )
