"""Store keys from Airflow ids: injective, readable for the ids Airflow makes itself."""

from __future__ import annotations

import itertools

from airflow_provider_kinetic.core.spec.identity import key_part, task_key

HOSTILE = [
    "exp:1", "exp+1", "exp~1", "exp 1", "exp_1", "exp/1", "exp%1", ".", "..",
    "学习", "训练", "学习~", "é", "e\u0301", "manual__2026-11-25T06:00:00+00:00",
]  # fmt: skip


def test_distinct_ids_give_distinct_keys():
    keys = [key_part(v) for v in HOSTILE]
    assert len(set(keys)) == len(HOSTILE)


def test_keys_are_single_safe_segments():
    for v in HOSTILE:
        k = key_part(v)
        assert "/" not in k and k not in (".", "..") and k.isascii() and " " not in k
        assert "%" not in k  # no percent-encoding questions in file:// URIs


def test_safe_ids_keep_their_form_airflow_ids_stay_readable():
    assert key_part("scheduled__2026-11-25") == "scheduled__2026-11-25"
    assert key_part("train.step-1=a") == "train.step-1=a"
    k = key_part("manual__2026-11-25T06:00:00+00:00")
    readable = "manual__2026-11-25T06_00_00_00_00"
    assert k.startswith(readable + "~") and len(k) == len(readable) + 1 + 16


def test_whole_task_keys_are_injective_and_plain_for_safe_ids():
    ids = [
        {"dag_id": d, "run_id": r, "task_id": t, "map_index": m}
        for d, r, t, m in itertools.product(
            ["d", "d:"], ["exp:1", "exp+1"], ["学习", "训练"], [-1, 0]
        )
    ]
    assert len({task_key(i) for i in ids}) == len(ids)
    safe = {"dag_id": "d", "run_id": "scheduled__x", "task_id": "t", "map_index": 3}
    assert task_key(safe) == "d/scheduled__x/t/3"
