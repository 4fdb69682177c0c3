"""A 1,000-input deferrable sweep through the Kubernetes API double defers once.

The map operator launches its first ``max_concurrent`` children and defers; its
trigger launches every other child as a slot frees up and fires once, when the
whole batch has ended, so the worker resumes once, to collect.  A "kubelet" thread
plays each child Job as it appears: it writes the child's result the way the runner
does (the payload, then its signature with the key from the Job's Secret) and marks
the Job succeeded, so 1,000 children cost no 1,000 runner processes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from airflow_provider_kinetic.core.jobs.payload import dump_result, make_result
from airflow_provider_kinetic.core.jobs.signing import RESULT_KEY_ENV, sign, signature_key
from airflow_provider_kinetic.core.storage import store_for_uri
from tests.fixtures.airflow_env import task_states, xcoms
from tests.fixtures.k8s_double import by_code_under_test
from tests.integration.core.backends.k8s.test_gke_dags import (  # noqa: F401 - fixtures
    JOBS,
    Kubelet,
    connections,
    google_token,
    run_dag,
)

pytestmark = pytest.mark.k8s_api(threaded=True)  # dag.test() calls it synchronously

TOTAL = int(os.environ.get("KINETIC_TEST_SWEEP_N", "1000"))


class ResultKubelet(Kubelet):
    """Plays every child Job as it appears: its result written as the runner would.
    ``total``: children to play; ``after``: requests already sent before it starts."""

    def __init__(self, double: Any, total: int = TOTAL, after: int = 0) -> None:
        super().__init__(double)
        self.total, self.cursor = total, after

    def play(self) -> None:
        seen = 0  # each poll looks only at requests after self.cursor
        while seen < self.total:
            if not self.until("a child Job", lambda d: len(d.requests) > self.cursor):
                return
            new = self.api.call(lambda d: list(d.requests[self.cursor :]))
            self.cursor += len(new)
            for request in by_code_under_test(new):
                if request.method == "POST" and request.url.path == JOBS:
                    self.finish(json.loads(request.body))
                    seen += 1

    def finish(self, job: dict[str, Any]) -> None:
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: self.env_value(e) for e in container["env"]}
        args = container["args"]
        uri = args[args.index("--result-gcs") + 1]
        index = int(env["KINETIC_GROUP_INDEX"])
        blob, _ = dump_result(make_result(success=True, result=2 * index, host_index=0))
        store, key = store_for_uri(uri)
        store.write_bytes(key, blob)
        store.write_bytes(signature_key(key), sign(env[RESULT_KEY_ENV], blob).encode())
        self.api.patch_status(f"{JOBS}/{job['metadata']['name']}", {"succeeded": 1})


def test_a_1000_input_deferrable_sweep_resumes_its_worker_once(
    load_dag,
    connections,  # noqa: F811 - the fixture
    api,
    capfd,
) -> None:
    assert os.environ.get("STORAGE_EMULATOR_HOST")
    kubelet = ResultKubelet(api)
    dr = run_dag(load_dag, "kinetic_sweep_gke_1000", kubelet, "kinetic_sweep_dags.py")
    out = "".join(capfd.readouterr())
    assert dr.state == "success", task_states(dr)
    values = xcoms(dr)
    assert values[("sweep", "return_value", -1)] == [2 * i for i in range(TOTAL)]
    dirs = values[("sweep", "kinetic_output_dirs", -1)]
    assert len(dirs) == TOTAL and dirs[7].rstrip("/").endswith("/sweep/-1/7")
    # One deferral; the worker ran the task twice in all (start, and the one resume).
    assert out.count("deferring until every child has ended") == 1, out[-3000:]
    starts = [line for line in out.splitlines() if "[DAG TEST] running task" in line]
    assert len([s for s in starts if ".sweep " in s]) <= 2, starts
    # Every child was created once: 1,000 Jobs, no duplicate names.
    names = [json.loads(r.body)["metadata"]["name"] for r in api.sent("POST", JOBS)]
    assert len(names) == TOTAL == len(set(names))
