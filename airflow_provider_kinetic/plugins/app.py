"""The Kinetic FastAPI app the plugin mounts on the API server (``/kinetic``).

Routes: ``/`` (jobs list, ``?group=`` for one batch), ``/jobs/{id}`` (job page),
``/api/jobs/{id}/log?offset=`` (the live log's JSON feed), ``/jobs/{id}/files?name=``
(one output file, as a download), ``POST /jobs/{id}/cancel``; each takes
``?conn_id=`` (default ``kinetic_default``).

Auth is Airflow's own: ``get_user`` reads the UI's JWT cookie (or a bearer token),
and the auth manager decides per DAG, as for task instances: reading a job needs
``GET`` on the DAG's task instances (jobs no record ties to a DAG need it on every
DAG), cancelling needs ``PUT`` (the job page shows its Cancel button only to a user
who has it).  The cancel POST must carry an ``X-Kinetic-Action``
header (a plain cross-site form cannot) and, when the browser sends one, a
same-origin ``Origin``.
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
from airflow_provider_kinetic.core.storage import ObjectNotFound
from airflow_provider_kinetic.plugins import jobs, views


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


def _open(conn_id: str, job_id: str, user: Any, method: str = "GET") -> jobs.OpenJob:
    try:
        found = jobs.open_job(_conn(conn_id), job_id)
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
#: The signed-in user, as Airflow's own routes get it (JWT cookie or bearer token).
User = Annotated[Any, Depends(get_user)]


def create_app() -> FastAPI:
    """A new app (the plugin mounts one; tests build their own)."""
    app = FastAPI(title="Kinetic", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(Denied)
    async def denied(request: Request, exc: Denied) -> Response:
        if "/api/jobs/" in request.url.path:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return HTMLResponse(views.error_page(exc.status, str(exc)), status_code=exc.status)

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

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, job_id: str, user: User, conn_id: ConnId = "kinetic_default"):
        found = _open(conn_id, job_id, user)
        # The Cancel button only for whom the cancel POST would not answer 403.
        can_cancel = _authorized(user, found.entry.dag_id, "PUT")
        return views.job_page(jobs.detail(found), _base(request), conn_id, can_cancel=can_cancel)

    @app.get("/api/jobs/{job_id}/log")
    def job_log(job_id: str, user: User, conn_id: ConnId = "kinetic_default", offset: int = 0):
        return jobs.log_chunk(_open(conn_id, job_id, user).job, offset)

    @app.get("/jobs/{job_id}/files")
    def job_file(job_id: str, user: User, name: str, conn_id: ConnId = "kinetic_default"):
        job = _open(conn_id, job_id, user).job
        key = jobs.output_key(job, name)
        if key is None:
            raise Denied(400, f"not a file of the job's output dir: {name!r}")
        try:
            data = job.store.read_bytes(key)
        except ObjectNotFound:
            raise Denied(404, f"no output file {name!r}") from None
        filename = urllib.parse.quote(name.rsplit("/", 1)[-1])
        return Response(
            data,
            media_type=mimetypes.guess_type(name)[0] or "application/octet-stream",
            headers={
                # A download, never a page of this origin (an output file is user data).
                "Content-Disposition": f"attachment; filename*=UTF-8''{filename}",
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox",
            },
        )

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

    return app
