"""Kinetic's datasets under OpenLineage's dataset naming spec (no OpenLineage import).

A local path names data only on its machine, so local paths and ``file://`` URIs are
the spec's *remote file system*: namespace ``file://{host}`` (the worker's name as
Airflow gives it), name the absolute path.  ``gs://`` is the spec's GCS (``gs://{bucket}``,
the object key).  Hugging Face datasets have no entry in the spec: namespace
``hf://datasets`` and the repo id as name make up the dataset's ``huggingface_hub``
file-system URI; the revision travels in a facet, as a dataset version.
"""

from __future__ import annotations

import logging
import os
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: The namespace of Hugging Face datasets: with the repo id as name, namespace/name is
#: the dataset's ``huggingface_hub`` file-system URI (``hf://datasets/org/name``).
HF_NAMESPACE = "hf://datasets"


@dataclass
class DataSet:
    """A dataset as Kinetic names it, before it becomes an OpenLineage one."""

    uri: str  # the Data path or output dir as the task gives it
    argument: str | None = None  # where it sits: "op_kwargs['train']", "output_dir"
    content_hash: str | None = None  # kinetic's content hash (local data)
    hashed_at: str | None = None  # "submit" (the packed one) or "complete" (again)


def hostname() -> str:
    """This worker's name as Airflow gives it ([core] hostname_callable): local paths
    are datasets of the machine that holds them."""
    try:
        from airflow.utils.net import get_hostname

        return str(get_hostname())
    except Exception:  # noqa: BLE001 - any name beats none
        return socket.getfqdn()


def dataset_name(uri: str, host: str) -> tuple[str, str, dict[str, str]]:
    """``(namespace, name, extra)`` of a Data path or output dir.

    ``gs://bucket/key`` -> ``gs://bucket``, ``key`` (a directory's trailing ``/``
    dropped, the bucket root ``/``); a local path or ``file://`` URI ->
    ``file://{host}``, the absolute path (the spec's remote file system: a path
    means something only on its machine); ``hf://org/name?revision=..`` ->
    ``hf://datasets``, ``org/name``, with ``revision`` / ``split`` / ``configName`` in
    ``extra``.  Anything else: ``scheme://authority`` and the path."""
    if uri.startswith("gs://"):
        bucket, _, key = uri[len("gs://") :].partition("/")
        return f"gs://{bucket}", key.rstrip("/") or "/", {}
    if uri.startswith("hf://"):
        from airflow_provider_kinetic.core.data.schemes.hf_load import parse_hf_uri

        src = parse_hf_uri(uri)
        extra = {"revision": src.revision, "split": src.split, "configName": src.config_name}
        return HF_NAMESPACE, src.repo, {k: v for k, v in extra.items() if v}
    if uri.startswith("file://"):
        from airflow_provider_kinetic.core.storage.fileuri import file_uri_path

        return f"file://{host}", file_uri_path(uri).rstrip("/") or "/", {}
    if "://" not in uri:
        path = os.path.abspath(os.path.expanduser(uri))
        return f"file://{host}", path.rstrip("/") or "/", {}
    parts = urllib.parse.urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}", parts.path or "/", {}


def named(items: Iterable[DataSet], host: str) -> list[tuple[str, str, dict[str, str], DataSet]]:
    """``(namespace, name, extra, item)`` of each item a scheme can name."""
    out = []
    for item in items:
        try:
            out.append((*dataset_name(item.uri, host), item))
        except ValueError as exc:  # a path no scheme reads: no dataset for it
            log.info("kinetic lineage: %s is no dataset: %s", item.uri, exc)
    return out
