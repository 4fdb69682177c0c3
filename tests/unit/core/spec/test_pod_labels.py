"""Airflow identity as Kubernetes labels: valid, distinct for distinct ids, -1 omitted."""

from __future__ import annotations

import re

from airflow_provider_kinetic.core.spec.pod import identity_labels, label_value

VALID = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_identity_labels():
    run_id = "scheduled__2026-11-20T00:00:00+00:00"
    labels = identity_labels(
        {"dag_id": "d" * 80, "task_id": "train", "run_id": run_id, "map_index": -1, "try_number": 2}
    )
    assert "airflow-map-index" not in labels
    assert labels["airflow-task-id"] == "train" and labels["airflow-try-number"] == "2"
    # Readable, and hash-suffixed because ':' and '+' had to go.
    assert labels["airflow-run-id"].startswith("scheduled__2026-11-20T00-00-00-00-00-")
    assert len(labels["airflow-dag-id"]) <= 63 and labels["airflow-dag-id"] != "d" * 63
    assert all(VALID.match(v) for v in labels.values())
    assert identity_labels({"map_index": 0}) == {"airflow-map-index": "0"}


def test_long_values_hash_apart():
    a, b = label_value("x" * 70 + "a"), label_value("x" * 70 + "b")
    assert a != b and len(a) <= 63 and VALID.match(a)


def test_distinct_ids_get_distinct_labels():
    ids = ["exp:1", "exp+1", "exp~1", "exp_1", "exp-1", "学习", "训练", "a b", "é", "x" * 63]
    labels = [label_value(v) for v in ids]
    assert len(set(labels)) == len(ids)
    assert all(len(v) <= 63 and VALID.match(v) and v for v in labels)
    assert label_value("exp_1") == "exp_1" and label_value("train") == "train"
