"""Typed wire records: JobHandle, JobTemplate and BatchState round trips.

The dict forms are what travels (XCom, trigger kwargs, handle.json); unknown keys
written by a newer version must survive a round trip through this one.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_kinetic.core.batch.state import BatchState
from airflow_provider_kinetic.core.data.mounts import FuseMount
from airflow_provider_kinetic.core.jobs.options import JobOptions
from airflow_provider_kinetic.core.spec.handles import (
    GROUP_FIELDS,
    HANDLE_FIELDS,
    InvalidHandleError,
    JobHandle,
)
from tests.fixtures import records


def test_handle_dict_is_kinetics_keys_in_order_then_ours():
    handle = records.handle("job-00000001", "/r", output_dir="file:///r/outputs/x")
    wire = handle.to_dict()
    assert tuple(wire)[: len(HANDLE_FIELDS)] == HANDLE_FIELDS
    assert wire["debug"] is False and wire["version"] == 1
    assert wire["output_dir"] == "file:///r/outputs/x"
    assert not set(GROUP_FIELDS) & set(wire)  # optional None fields are dropped
    assert JobHandle.from_dict(json.loads(json.dumps(wire))) == handle


def test_handle_keeps_unknown_keys_and_group_fields():
    wire = {
        **records.handle(
            "job-00000002", group_id="grp-1", group_kind="map", group_index=3
        ).to_dict(),
        "from_the_future": {"nested": [1, 2]},
        "version": 7,
    }
    handle = JobHandle.from_dict(wire)
    assert (handle.group_id, handle.group_index, handle.version) == ("grp-1", 3, 7)
    assert handle.extra == {"from_the_future": {"nested": [1, 2]}}
    assert handle.to_dict() == wire


def test_required_strings_never_none():
    wire = JobHandle(job_id="job-1", backend="local", bucket_name="/r", project=None).to_dict()
    assert wire["project"] == ""


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("job-1", "must be a dict, got str"),
        ({"job_id": "job-1", "backend": "local"}, "missing bucket_name"),
        ({"backend": "gke", "bucket_name": "b"}, "missing job_id"),
    ],
)
def test_bad_handles_are_named(value, match):
    with pytest.raises(InvalidHandleError, match=match):
        JobHandle.from_dict(value)


def test_template_round_trip_with_fuse_mounts():
    template = records.template(
        "gke",
        fuse=[FuseMount("gs://b/p/", "/mnt/p", True)],
        env={"A": "1"},
        options=JobOptions(labels={"team": "ml"}, cpu="2"),
        group_id="grp-9",
    )
    wire = json.loads(json.dumps(template.to_dict()))
    assert type(template).from_dict(wire) == template


def test_batch_state_round_trip_keeps_int_indices_and_unknown_keys():
    state = records.batch_state(5, {0: "job-a", 3: "job-b"}, retries=2, backend="gke")
    state.done[1] = "SUCCEEDED"
    state.submit_errors[2] = "boom"
    state.deadline = 123.5
    wire = json.loads(json.dumps(state.to_dict()))
    assert set(wire["active"]) == {"0", "3"}  # JSON object keys
    wire["added_later"] = [1]
    back = BatchState.from_dict(wire)
    assert back.active[3].job_id == "job-b" and back.done == {1: "SUCCEEDED"}
    assert back.submit_errors == {2: "boom"} and back.queue == [1, 2, 4]
    assert back.backend == "gke" and back.deadline == 123.5
    assert back.extra == {"added_later": [1]}
    assert back.to_dict() == wire


def test_batch_state_rejects_non_states():
    with pytest.raises(TypeError, match="not a kinetic batch state"):
        BatchState.from_dict({"group_id": "grp-1"})
