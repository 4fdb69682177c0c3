"""The Kinetic FastAPI app the plugin mounts on the API server (``/kinetic``).

Routes: ``/`` (jobs list, ``?group=`` for one batch), ``/keys`` (keys and their
versions, ``?prefix=``), ``/jobs/{id}`` (job page),
``/api/jobs/{id}/log?offset=`` (the live log's JSON feed), ``/jobs/{id}/files?name=``
(one output file, as a download), ``POST /jobs/{id}/cancel``; the task instance tab
``/ti/{dag_id}/{run_id}/{task_id}/{map_index}`` (``?child=N``: a batch child's log),
with its batch feed ``/api/batches/{id}/children`` and ``/batches/{id}/files?name=``;
a batch child's page and log take ``?batch=`` (found by its batch once its own
``handle.json`` is gone).  Each takes ``?conn_id=`` (default ``kinetic_default``).

Auth is Airflow's own: ``get_user`` reads the UI's JWT cookie (or a bearer token),
and the auth manager decides per DAG, as for task instances: reading a job needs
``GET`` on the DAG's task instances (jobs no record ties to a DAG need it on every
DAG), cancelling needs ``PUT`` (the job page shows its Cancel button only to a user
who has it).  The cancel POST must carry an ``X-Kinetic-Action``
header (a plain cross-site form cannot) and, when the browser sends one, a
same-origin ``Origin``.

Output files and logs are read through the store, which never follows a link out of
its root (``core/storage/local.py``): a link a job left to a file outside is not
listed, and its download (or any read it leads) answers 403.
"""

from __future__ import annotations

import mimetypes
import urllib.parse
from typing import Annotated, Any

# Airflow 3's API server (an ImportError on Airflow 2 leaves the plugin without app).
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.storage import ObjectNotFound, ObjectStore, OutsideStoreError
from airflow_provider_kinetic.hooks.kinetic import KineticHook
from airflow_provider_kinetic.plugins import jobs, keyview, tasks, taskview, views


class Denied(Exception):
    """A request the page answers with an error status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _authorized(user: Any, dag_id: str | None, method: str) -> bool:
    details = DagDetails(id=dag_id) if dag_id else None
    return get_auth_manager().is_authorized_dag(
        method=method,  # type: ignore[arg-type]  # a ResourceMethod literal
        access_entity=DagAccessEntity.TASK_INSTANCE,
        details=details,
        user=user,
    )


def _require(user: Any, dag_id: str | None, method: str) -> None:
    if not _authorized(user, dag_id, method):
        what = f"DAG {dag_id!r}" if dag_id else "every DAG (the job names none)"
        raise Denied(403, f"not allowed to {method} task instances of {what}")


def _conn(conn_id: str) -> str:
    if not jobs.CONN_ID.fullmatch(conn_id):
        raise Denied(400, f"bad connection id {conn_id!r}")
    return conn_id


def _open(
    conn_id: str, job_id: str, user: Any, method: str = "GET", batch: str = ""
) -> jobs.OpenJob:
    try:
        found = jobs.open_job(_conn(conn_id), job_id, batch or None)
    except ValueError as exc:
        raise Denied(400, str(exc)) from None
    except ObjectNotFound:
        raise Denied(404, f"no kinetic job {job_id!r} (connection {conn_id!r})") from None
    _require(user, found.entry.dag_id, method)
    return found


def _base(request: Request) -> str:
    """Where the API server mounted this app (``/kinetic``, or under a base path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


ConnId = Annotated[str, Query(max_length=250)]
BatchId = Annotated[str, Query(max_length=250)]
#: The signed-in user, as Airflow's own routes get it (JWT cookie or bearer token).
User = Annotated[Any, Depends(get_user)]


def create_app() -> FastAPI:
    """A new app (the plugin mounts one; tests build their own)."""
    app = FastAPI(title="Kinetic", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(Denied)
    async def denied(request: Request, exc: Denied) -> Response:
        if "/api/" in request.url.path:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return HTMLResponse(views.error_page(exc.status, str(exc)), status_code=exc.status)

    @app.exception_handler(OutsideStoreError)
    async def outside_store(request: Request, exc: OutsideStoreError) -> Response:
        # A read that a link in the store led outside it (a log, a record): refused,
        # without the target's path (the server's layout is not the viewer's business).
        return await denied(request, Denied(403, "refused: a link that leads outside the store"))

    @app.exception_handler(KineticError)
    async def kinetic_error(request: Request, exc: KineticError) -> Response:
        return HTMLResponse(views.error_page(400, str(exc)), status_code=400)

    @app.get("/", response_class=HTMLResponse)
    def jobs_list(
        request: Request, user: User, conn_id: ConnId = "kinetic_default", group: str = ""
    ) -> str:
        rows = jobs.list_rows(_conn(conn_id), group=group or None)
        allowed: dict[str | None, bool] = {}
        visible = []
        for row in rows:
            if row.dag_id not in allowed:
                allowed[row.dag_id] = _authorized(user, row.dag_id, "GET")
            if allowed[row.dag_id]:
                visible.append(row)
        return views.jobs_page(visible, _base(request), conn_id, group or None)

    @app.get("/keys", response_class=HTMLResponse)
    def keys_list(
        request: Request, user: User, conn_id: ConnId = "kinetic_default", prefix: str = ""
    ) -> str:
        # Keys are shared by every DAG (not tied to one): reading them needs read
        # access to the task instances of every DAG, as a job no record ties to a DAG.
        _require(user, None, "GET")
        try:
            states = keyview.key_states(KineticHook(_conn(conn_id)).get_store(), prefix)
        except ValueError as exc:  # a prefix not of the key form
            raise Denied(400, str(exc)) from None
        return keyview.keys_page(states, _base(request), conn_id, prefix)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(
        request: Request,
        job_id: str,
        user: User,
        conn_id: ConnId = "kinetic_default",
        batch: BatchId = "",
    ):
        found = _open(conn_id, job_id, user, batch=batch)
        # The Cancel button only for whom the cancel POST would not answer 403.
        can_cancel = _authorized(user, found.entry.dag_id, "PUT")
        return views.job_page(jobs.detail(found), _base(request), conn_id, can_cancel=can_cancel)

    @app.get("/api/jobs/{job_id}/log")
    def job_log(
        job_id: str,
        user: User,
        conn_id: ConnId = "kinetic_default",
        offset: int = 0,
        batch: BatchId = "",
    ):
        return jobs.log_chunk(_open(conn_id, job_id, user, batch=batch).job, offset)

    @app.get("/jobs/{job_id}/files")
    def job_file(job_id: str, user: User, name: str, conn_id: ConnId = "kinetic_default"):
        job = _open(conn_id, job_id, user).job
        return _download(job.store, jobs.output_key(job, name), name)

    @app.post("/jobs/{job_id}/cancel")
    def job_cancel(request: Request, job_id: str, user: User, conn_id: ConnId = "kinetic_default"):
        if request.headers.get("x-kinetic-action") != "cancel":
            raise Denied(400, "missing X-Kinetic-Action: cancel header")
        origin = request.headers.get("origin")
        if origin and urllib.parse.urlsplit(origin).netloc != request.headers.get("host"):
            raise Denied(403, f"cross-origin cancel refused (Origin {origin})")
        job = _open(conn_id, job_id, user, method="PUT").job
        job.cancel()
        return {"job_id": job.job_id, "cancel_requested": True}

    @app.get("/ti/{dag_id}/{rest:path}", response_class=HTMLResponse)
    def task_tab(
        request: Request,
        dag_id: str,
        rest: str,
        user: User,
        conn_id: ConnId = "kinetic_default",
        child: int | None = None,
    ) -> str:
        # The run id sits between the dag id and the task id and may hold a "/" (Airflow
        # 3.3 percent-encodes it; the server decodes the path before routing).
        parts = rest.rsplit("/", 2)
        if len(parts) != 3 or not all(parts[:2]):
            raise Denied(404, "expected /ti/{dag_id}/{run_id}/{task_id}/{map_index}")
        run_id, task_id, raw_index = parts
        try:
            map_index = tasks.parse_map_index(raw_index)
        except ValueError:
            raise Denied(400, f"bad map index {raw_index!r}") from None
        _require(user, dag_id, "GET")
        view = tasks.task_view(_conn(conn_id), dag_id, run_id, task_id, map_index)
        base = _base(request)
        quoted = "/".join(urllib.parse.quote(p, safe="") for p in (dag_id, *parts))
        here = views._link(base, "/ti/" + quoted, conn_id)
        return taskview.task_tab(
            view, base, conn_id, here, can_cancel=_authorized(user, dag_id, "PUT"), child=child
        )

    @app.get("/api/batches/{group_id}/children")
    def batch_children(group_id: str, user: User, conn_id: ConnId = "kinetic_default"):
        entry = _batch(conn_id, group_id, user)
        return tasks.children_feed(conn_id, entry)

    @app.get("/batches/{group_id}/files")
    def batch_file(group_id: str, user: User, name: str, conn_id: ConnId = "kinetic_default"):
        entry = _batch(conn_id, group_id, user)
        store = KineticHook(conn_id).get_store()
        return _download(store, jobs.output_name_key(store, entry.get("output_dir"), name), name)

    return app


def _batch(conn_id: str, group_id: str, user: Any) -> dict[str, Any]:
    """The history entry of batch ``group_id``, for a user who may read its task."""
    if not jobs.GROUP_ID.fullmatch(group_id):
        raise Denied(400, f"not a kinetic batch id: {group_id!r}")
    entry = jobs.batch_entry(KineticHook(_conn(conn_id)).get_store(), group_id)
    if entry is None:
        raise Denied(404, f"no kinetic batch {group_id!r} (connection {conn_id!r})")
    _require(user, entry.get("dag_id"), "GET")
    return entry


def _download(store: ObjectStore, key: str | None, name: str) -> Response:
    """One output file as a download, never a page of this origin (it is user data)."""
    if key is None:
        raise Denied(400, f"not a file of the output dir: {name!r}")
    try:
        data = store.read_bytes(key)
    except ObjectNotFound:
        raise Denied(404, f"no output file {name!r}") from None
    except OutsideStoreError:  # a link the job left, to something outside the store
        raise Denied(403, f"output file {name!r} is a link out of the store: refused") from None
    filename = urllib.parse.quote(name.rsplit("/", 1)[-1])
    return Response(
        data,
        media_type=mimetypes.guess_type(name)[0] or "application/octet-stream",
        headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{filename}",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",
        },
    )
