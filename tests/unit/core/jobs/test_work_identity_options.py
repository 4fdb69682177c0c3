"""The options of work identity fail early, naming the bad value and what is allowed;
checkpoint slots key on the work unless ``checkpoint_restore="any"``."""

from __future__ import annotations

import pytest

from airflow_provider_kinetic.core.jobs.checkpoint import checkpoint_key, work_slot
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.keys.publish import check_policy

IDENTITY = {"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": -1}


def test_a_bad_checkpoint_restore_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"'same_work' or 'any', got 'newest'"):
        JobOptions(checkpoint_restore="newest")
    assert JobRequest(func=print).options.checkpoint_restore == "same_work"


def test_a_bad_output_key_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"'newest_logical_date' or 'last_finisher', got 'x'"):
        check_policy("x")


def test_checkpoint_slots_key_on_the_work_unless_any():
    a, b = work_slot("work-a"), work_slot("work-b")
    assert a != b
    slot_a = checkpoint_key(IDENTITY, "job-1", 3, a)
    assert slot_a != checkpoint_key(IDENTITY, "job-1", 3, b)
    assert slot_a == checkpoint_key(IDENTITY, "job-2", 3, work_slot("work-a"))  # a resubmit
    # "any": one slot per task run, whatever the work (the layout of earlier versions).
    assert work_slot("work-a", "any") is None
    assert checkpoint_key(IDENTITY, "job-1", 3, None).endswith("/-1/inputs/3/")
