"""What a local job's environment holds: one rule for every backend.

A GKE job sees only what its pod spec sets: kinetic's own variables and the captured
ones (``capture_env_vars``).  A local job sees the same, plus what a process on this
machine needs to run at all (``RUNTIME``: the search path, home, locale, time zone,
temp dir, the interpreter's own ``PYTHONPATH`` / ``VIRTUAL_ENV`` so the job's python
imports what the worker's can, the devices the worker may use) and the settings that
steer kinetic's own job machinery (``MACHINERY``: slot and GPU-lock dirs, the local
store's emulators, timeouts).  Never the worker's settings and secrets:
``AIRFLOW__*``, ``AIRFLOW_CONN_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AWS_*`` and
the rest stay out unless captured.  ``[kinetic] local_inherit_env = True`` restores
the old behaviour (the job inherits the worker's whole environment).

Captured values reach the job one of two ways, both after this rule: secrets (from
Airflow) in the job's 0600 ``secrets.json``, which the supervisor adds; plain captured
env (kinetic's own runner) in the spec's env, i.e. the ``overlay`` here.
"""

from __future__ import annotations

from collections.abc import Mapping

#: What any process on this machine needs to run (names, and ``LC_*``).
RUNTIME = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    }
)
RUNTIME_PREFIXES = ("LC_",)

#: Settings kinetic's job machinery (supervisor, runner, stores) reads from the
#: environment that the backend does not set per job; per-job ones (``JOB_ID``,
#: ``KINETIC_OUTPUT_DIR``, ``KINETIC_RESULT_KEY``, ...) come in the overlay.
MACHINERY = frozenset(
    {
        "KINETIC_LOCAL_MAX_JOBS",
        "KINETIC_LOCAL_SLOTS",
        "KINETIC_LOCAL_GPUS",
        "KINETIC_LOCAL_GPU_LOCKS",
        "KINETIC_LOCAL_FIND_LINKS",
        "KINETIC_HOST_TMPDIR",
        "KINETIC_STATCACHE_DIR",
        "KINETIC_NATIVE_LSTAT",
        "KINETIC_STORE_OUTAGE_WINDOW_S",
        "KINETIC_CHECKPOINT_SYNC_S",
        "KINETIC_CHECKPOINT_GRACE_S",
        "KINETIC_PEER_CONNECT_S",
        "KINETIC_PACKAGE_ROOT",
        "KINETIC_NO_DEFAULT_EXCLUDES",
        # An endpoint, not a credential: gs:// stores of a development setup.
        "STORAGE_EMULATOR_HOST",
    }
)


def kept(name: str) -> bool:
    """Whether a worker variable reaches a local job that does not inherit."""
    return name in RUNTIME or name in MACHINERY or name.startswith(RUNTIME_PREFIXES)


def job_environment(
    worker_env: Mapping[str, str],
    overlay: Mapping[str, str],
    *,
    inherit: bool = False,
    captured: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A local job's environment: the worker's runtime and machinery variables (all
    of ``worker_env`` with ``inherit``), then ``captured``, then the backend's
    ``overlay`` (the job's own variables, which win)."""
    env = dict(worker_env) if inherit else {k: v for k, v in worker_env.items() if kept(k)}
    env.update(captured or {})
    env.update(overlay)
    return env
