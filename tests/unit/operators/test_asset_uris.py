"""operators.assets: a key's asset (``kinetic://KEY``) is made without Airflow's scheme
normalizer lookup, which imports every installed provider's asset handlers (the
google provider's GCS hook among them: seconds per task process on a loaded machine),
and equal what Airflow itself makes of the same URIs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_provider_kinetic.operators.assets import key_asset_uri, known_asset

CHILD = """
import json, sys
from airflow_provider_kinetic.operators.assets import known_asset, task_asset
before = set(sys.modules)
assets = [known_asset("kinetic://models/churn"), known_asset("kinetic://a"),
          task_asset("daily.train", "fit_é")]
print(json.dumps({"uris": [a.uri for a in assets], "names": [a.name for a in assets],
                  "imported": sorted(set(sys.modules) - before)}))
"""


def test_making_the_event_assets_imports_no_provider():
    """A key's asset and a task's (``x-`` scheme: no normalizer) cost no import."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    task = "x-kinetic-task://daily.train/fit_%C3%A9"  # a task's stable output asset
    assert found["uris"] == ["kinetic://models/churn", "kinetic://a/", task]
    assert found["names"] == ["kinetic://models/churn", "kinetic://a", task]
    assert found["imported"] == []  # no provider's asset handlers (nothing at all)


@pytest.mark.parametrize("key", ["models/churn", "a", "a/", "team-a/nightly.v2/model_1"])
def test_a_known_asset_equals_airflows_own(key):
    from airflow.providers.common.compat.sdk import Asset

    uri = key_asset_uri(key)
    assert known_asset(uri) == Asset(uri=uri)


def test_a_run_dir_airflow_refuses_as_an_asset_uri_costs_the_event_not_the_task(caplog):
    """A fallback's (or a mapped instance's) own dir as the alias's asset: a dir that is
    no asset URI Airflow accepts leaves the event out with a warning; the job's result
    stands (any dir the backend accepts is a valid output_dir)."""
    import logging

    from airflow_provider_kinetic.operators.assets import _run_asset, task_alias

    class Op:
        log = logging.getLogger("test-run-asset")

    alias = task_alias("d", "t")
    assert _run_asset(Op(), "file:///tmp/out/d/run/t/-1", alias).uri == "file:///tmp/out/d/run/t/-1"
    with caplog.at_level(logging.WARNING, logger="test-run-asset"):
        assert _run_asset(Op(), "airflow://not-an-asset", alias) is None
    assert "no asset event through alias kinetic:d/t" in caplog.text
