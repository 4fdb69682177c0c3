"""A run made again under the same run id is a new run: its kinetic:// pins are not the
earlier instance's (core/keys/pins.same_run_instance, issue 37's run identity)."""

from __future__ import annotations

import pytest

from airflow_provider_kinetic.core.keys.pins import same_run_instance

FIRST = {"clear_number": 0, "run_start": "2026-11-01T00:00:05", "try_number": 1, "ti_id": "a"}


@pytest.mark.parametrize(
    ("now", "same"),
    [
        (FIRST, True),  # the same try (a deferral's resume)
        ({**FIRST, "try_number": 2, "ti_id": "b"}, True),  # a retry
        ({**FIRST, "clear_number": 1, "run_start": "later", "try_number": 2, "ti_id": "c"}, True),
        ({**FIRST, "ti_id": "b"}, False),  # try 1 again, another id: made anew
        ({**FIRST, "run_start": "later", "try_number": 2, "ti_id": "b"}, False),  # re-made run
        ({**FIRST, "clear_number": 0, "try_number": 0}, False),  # counts went down
        (None, True),  # a caller without a run (a dry run): as before
    ],
)
def test_what_tells_a_run_instance_from_an_earlier_one(now, same):
    assert same_run_instance(FIRST, now) is same


def test_a_record_from_before_the_fields_is_this_instances():
    assert same_run_instance(None, FIRST) and same_run_instance({}, FIRST)
