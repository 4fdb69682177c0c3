"""What the runner was asked to do: kinetic 0.0.4's command line, and which host runs.

Both the run (``remote.py``) and the LeaderWorkerSet outcome markers (``lws.py``) read
them, so they live below both.  The flags are kinetic's, so the same Job spec works
with kinetic's ``/app/remote_runner.py`` and with ours.
"""

from __future__ import annotations

import argparse
import os
import re


def parse_args(argv: list[str]) -> argparse.Namespace:
    """kinetic's flags; the legacy positional form and unknown flags are tolerated."""
    p = argparse.ArgumentParser(prog="airflow_provider_kinetic.runner")
    p.add_argument("--context-gcs")
    p.add_argument("--payload-gcs")
    p.add_argument("--result-gcs")
    p.add_argument("--requirements-gcs")
    p.add_argument("--payload-sha256")
    p.add_argument("--context-sha256")
    ns, rest = p.parse_known_args(argv)
    positional = [a for a in rest if not a.startswith("--")]
    for name, value in zip(
        ("context_gcs", "payload_gcs", "result_gcs", "requirements_gcs"), positional, strict=False
    ):
        if getattr(ns, name) is None:
            setattr(ns, name, value)
    missing = [f for f in ("context_gcs", "payload_gcs", "result_gcs") if not getattr(ns, f)]
    if missing:
        p.error("missing required flags: " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return ns


def host_index() -> int:
    """This host's index in the job: first non-negative integer in TPU_WORKER_ID, then
    LWS_WORKER_INDEX, else 0; in a multi-slice job (``KINETIC_SLICE_HOSTS`` hosts per
    slice) offset by its slice (``MEGASCALE_SLICE_ID``), so only slice 0 host 0 is 0."""
    worker = 0
    for var in ("TPU_WORKER_ID", "LWS_WORKER_INDEX"):
        m = re.search(r"\d+", os.environ.get(var, ""))
        if m:
            worker = int(m.group())
            break
    per_slice = os.environ.get("KINETIC_SLICE_HOSTS", "")
    slice_id = os.environ.get("MEGASCALE_SLICE_ID", "")
    if per_slice.isdigit() and slice_id.isdigit():
        return int(slice_id) * int(per_slice) + worker
    return worker


def slice_fields() -> dict[str, int]:
    """A multi-slice job's layout for its result payload (``num_slices``, ``slice_hosts``:
    hosts per slice), so a failure names its slice; ``{}`` for a job of one slice."""
    per_slice = os.environ.get("KINETIC_SLICE_HOSTS", "")
    slices = os.environ.get("MEGASCALE_NUM_SLICES", "")
    if per_slice.isdigit() and slices.isdigit() and "MEGASCALE_SLICE_ID" in os.environ:
        return {"num_slices": int(slices), "slice_hosts": int(per_slice)}
    return {}
