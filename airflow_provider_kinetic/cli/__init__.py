"""``airflow kinetic ...``: operate jobs and the data cache from a shell.

Airflow 3 providers add CLI groups through the ``cli`` entry of their provider info
(``get_provider_info()["cli"]`` names :func:`get_kinetic_cli_commands`); Airflow's
parser calls it and adds the returned ``GroupCommand``.  The same definitions back
``python -m airflow_provider_kinetic.cli`` (see ``__main__``), so the commands work
before the provider is installed as a distribution, and the two entry points cannot
drift apart.

Actions are loaded lazily (``lazy_load_command``): ``airflow --help`` imports nothing
of the backends.  They live by group: ``jobs``, ``data``, ``catalog`` (the
``accelerators`` command), ``cache`` and ``usage``, on the shared plumbing in ``common``.

Read-only commands (``jobs list/status/logs/result``, ``data ls``, ``cache ls``, ``accelerators``,
``usage``) run inside ``hooks.kinetic.reading_only()``: without a ``kinetic_default``
connection they read the local store without the "jobs run ON THIS MACHINE" warning,
which is about running jobs (commands that cancel or delete keep it: it names the
store they change).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ACTIONS = "airflow_provider_kinetic.cli."  # + "module.function"


def read_only_command(loaded: Callable[..., Any]) -> Callable[..., Any]:
    """``loaded`` (a lazily loaded action) run inside ``reading_only()``."""

    def command(*args: Any, **kwargs: Any) -> Any:
        from airflow_provider_kinetic.hooks.kinetic import reading_only

        with reading_only():
            return loaded(*args, **kwargs)

    command.__name__ = loaded.__name__
    return command


def get_kinetic_cli_commands() -> list[Any]:
    """The ``kinetic`` command group, in the shape Airflow's CLI parser expects."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    conn = Arg(
        ("--conn-id",),
        help="Kinetic connection id (default: kinetic_default; when that connection is "
        "missing, the local backend under $AIRFLOW_HOME/kinetic)",
        default="kinetic_default",
    )
    output = Arg(
        ("-o", "--output"),
        help="Output format: table (for people) or json (for scripts)",
        choices=("table", "json"),
        default="table",
        metavar="(table, json)",
    )
    job = Arg(("job_id",), help="Job id (job-xxxxxxxx)", metavar="JOB")
    common = (conn, output)
    dag_id = Arg(("--dag-id",), help="Only jobs of this DAG")
    since = Arg(
        ("--since",),
        help="Only jobs submitted within AGE (e.g. 7d, 12h) or since a UTC date "
        "(2026-11-24 or 2026-11-24T06:00:00Z)",
        metavar="AGE|DATE",
    )

    def action(name: str, helptext: str, func: str, *args: Any, read_only: bool = False) -> Any:
        loaded = lazy_load_command(_ACTIONS + func)
        return ActionCommand(
            name=name,
            help=helptext,
            func=read_only_command(loaded) if read_only else loaded,
            args=(*args, *common),
        )

    jobs = GroupCommand(
        name="jobs",
        help="List and operate kinetic jobs",
        subcommands=(
            action(
                "list",
                "List jobs from the store's job history (it outlives cleanup), newest first",
                "jobs.jobs_list",
                dag_id,
                Arg(
                    ("--state",),
                    help="Only jobs in this state (SUBMITTED, PENDING, RUNNING, SUCCEEDED, "
                    "FAILED, CANCELLED, PREEMPTED, NOT_FOUND)",
                ),
                since,
                Arg(
                    ("--run-id",),
                    help="Only jobs of this DAG run (its id exactly as Airflow shows it)",
                ),
                Arg(
                    ("--logical-date",),
                    help="Only jobs of runs with this logical date: a date (2026-11-21) or "
                    "the start of an ISO date-time (2026-11-21T06:00)",
                    metavar="DATE",
                ),
                Arg(
                    ("--map-index",), help="Only jobs of this map index (-1: not mapped)", type=int
                ),
                Arg(
                    ("--children",),
                    help="Follow each batch's row with its children (CHILD: the input index)",
                    action="store_true",
                ),
                Arg(
                    ("--limit",), help="At most this many jobs (default 100)", type=int, default=100
                ),
                read_only=True,
            ),
            action("status", "Show a job's state", "jobs.jobs_status", job, read_only=True),
            action(
                "logs",
                "Print a job's log",
                "jobs.jobs_logs",
                job,
                Arg(
                    ("-f", "--follow"), help="Keep printing until the job ends", action="store_true"
                ),
                Arg(
                    ("--poll-interval",),
                    help="Seconds between reads with --follow (default 1)",
                    type=float,
                    default=1.0,
                ),
                read_only=True,
            ),
            action(
                "result",
                "Print a finished job's return value",
                "jobs.jobs_result",
                job,
                Arg(("--wait",), help="Wait for a running job to end", action="store_true"),
                Arg(
                    ("--timeout",),
                    help="Seconds to wait with --wait (default: no limit)",
                    type=float,
                    default=None,
                ),
                read_only=True,
            ),
            action(
                "debug",
                "Attach a debugger to a debug job (debug=True): print where its debugpy "
                "listens (GKE: port-forward to its pod until it ends) and VS Code's launch.json",
                "debug.jobs_debug",
                job,
                Arg(
                    ("--port",),
                    help="Local port of the forward on a cluster (default: the job's "
                    "debug_port; 0: any free port)",
                    type=int,
                    default=None,
                ),
                read_only=True,
            ),
            action(
                "cancel",
                "Cancel a job (no later try of its task adopts it)",
                "jobs.jobs_cancel",
                job,
                Arg(
                    ("--wait-s",),
                    help="Seconds to wait for the job to end (default 30)",
                    type=float,
                    default=30.0,
                ),
            ),
            action(
                "cleanup",
                "Delete ended jobs' artifacts and cluster objects (JOB, or --older-than AGE); "
                "with neither, apply the retention ([kinetic] failed_retention_days, "
                "history_retention_days)",
                "cleanup.jobs_cleanup",
                Arg(("job_id",), help="Job id", metavar="JOB", nargs="?", default=None),
                Arg(
                    ("--older-than",),
                    help="Every finished job created longer ago than AGE (e.g. 7d, 12h, 30m, 45s)",
                    metavar="AGE",
                ),
                Arg(
                    ("--dry-run",),
                    help="Only show what would be deleted, with sizes",
                    action="store_true",
                ),
                Arg(
                    ("--force",),
                    help="Also delete artifacts an XCom still needs (a handle a waiting "
                    "sensor reads, a result reference of a recent DAG run)",
                    action="store_true",
                ),
            ),
        ),
    )
    data = GroupCommand(
        name="data",
        help="Inspect and trim the content-addressed data cache",
        subcommands=(
            action("ls", "List data-cache entries", "data.data_ls", read_only=True),
            action(
                "gc",
                "Delete cache entries whose completion marker is older than AGE, and local "
                "jobs' requirements venvs unused for AGE",
                "data.data_gc",
                Arg(("--older-than",), help="e.g. 7d, 12h, 30m, 45s", metavar="AGE", required=True),
                Arg(("--dry-run",), help="Only show what would be deleted", action="store_true"),
                Arg(
                    ("--force",),
                    help="Skip the check of Airflow's database for XComs that name cache "
                    "entries (jobs in the history and live keys still keep theirs)",
                    action="store_true",
                ),
            ),
        ),
    )
    key = Arg(("key",), help="Key (models/churn; KEY@VERSION pins a version)", metavar="KEY")
    version = Arg(("--version",), help="A version (content hash or a unique prefix of it)")
    store = GroupCommand(
        name="store",
        help="Named, versioned data (keys): put, get, ls, rm",
        subcommands=(
            action(
                "put",
                "Make SRC (a file or directory) KEY's new version",
                "store.store_put",
                key,
                Arg(("src",), help="A local file or directory", metavar="SRC"),
                Arg(("--ttl",), help="Expire the key this long after its latest put (7d)"),
            ),
            action(
                "get",
                "Write KEY's current version (or --version) to DEST, verified",
                "store.store_get",
                key,
                Arg(("dest",), help="Where to write it (must not exist, or be empty)"),
                version,
                Arg(("--overwrite",), help="Replace a DEST that exists", action="store_true"),
            ),
            action(
                "ls",
                "List keys (current version, size, files, time, who; --versions: every "
                "kept version, with its pins)",
                "store.store_ls",
                Arg(("prefix",), help="Only keys starting with this", nargs="?", default=""),
                Arg(
                    ("--versions",),
                    help="Every kept version of each key, newest first, with the task "
                    "instances that pinned it",
                    action="store_true",
                ),
                read_only=True,
            ),
            action(
                "rm",
                "Remove a version of KEY, KEY, or every key under a prefix (--recursive)",
                "store.store_rm",
                key,
                version,
                Arg(("--recursive",), help="Every key under KEY/ too", action="store_true"),
                Arg(("--dry-run",), help="Only show what would be removed", action="store_true"),
            ),
        ),
    )
    cache = GroupCommand(
        name="cache",
        help="Reusable results of cache=True tasks: ls, rm",
        subcommands=(
            action(
                "ls", "List cache entries, newest first", "cache.cache_ls", dag_id, read_only=True
            ),
            action(
                "rm",
                "Drop cache entries (KEY prefixes, or --all); their jobs' artifacts go "
                "unless something else holds them",
                "cache.cache_rm",
                Arg(("keys",), help="Cache keys or unique prefixes", metavar="KEY", nargs="*"),
                Arg(("--all",), help="Every entry", action="store_true"),
                Arg(("--dry-run",), help="Only show what would be dropped", action="store_true"),
            ),
        ),
    )
    catalog = action(
        "accelerators",
        "List the accelerators jobs may ask for",
        "catalog.accelerators",
        read_only=True,
    )
    usage = action(
        "usage",
        "Sum what jobs held (chip-hours, run hours, queued time, preemptions; an "
        "estimated cost with [kinetic] price_table) from the job history",
        "usage.usage",
        dag_id,
        since,
        Arg(
            ("--by",),
            help="Sum per dag (default), task, accelerator or capacity",
            choices=("dag", "task", "accelerator", "capacity"),
            default="dag",
        ),
        read_only=True,
    )
    return [
        GroupCommand(
            name="kinetic",
            help="Kinetic jobs, data cache, keys, result cache, accelerators and usage",
            subcommands=(jobs, data, store, cache, catalog, usage),
        )
    ]
