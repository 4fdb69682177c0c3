"""Bundled images through the real Artifact Registry and Cloud Build clients.

``gcp/image_build.py`` runs unmocked: providers-google's ``CloudBuildHook`` and the
``google-cloud-artifact-registry`` client talk REST to the loopback double
(``tests/fixtures/cloudbuild_double.py``), and the build context goes through the
real GCS store into fake-gcs-server, from where the double reads it back.  The double
writes the build's log into fake-gcs-server as Cloud Build does (growing over several
polls), and the hook copies its lines into the task log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.runtime import wheel
from airflow_provider_kinetic.core.runtime.images import ImagePlan, plan_image
from airflow_provider_kinetic.core.storage.gcs import GcsStore
from airflow_provider_kinetic.gcp.build_log import BuildLogTail
from airflow_provider_kinetic.gcp.image_build import (
    BUILDS_PREFIX,
    DOCKER_BUILDER,
    ENDPOINT_ENV,
    LOGS_PREFIX,
    ImageBuildError,
    ImageBuildHook,
)
from tests.fixtures.cloudbuild_double import CloudBuildDouble, cloudbuild_double
from tests.fixtures.local_conn import set_conn


@pytest.fixture
def store(fake_gcs, gcs_bucket: str) -> GcsStore:
    return GcsStore(gcs_bucket, client=fake_gcs.client())


@pytest.fixture
def double(store: GcsStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[CloudBuildDouble]:
    def read_source(bucket: str, key: str) -> bytes:
        assert bucket == store.bucket
        return store.read_bytes(key)

    def write_object(bucket: str, key: str, data: bytes) -> None:
        assert bucket == store.bucket
        store.write_bytes(key, data, content_type="text/plain")

    # CloudBuildHook reads the connection's gcp_conn_id, as in production.
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    with cloudbuild_double(read_source, write_object) as d:
        monkeypatch.setenv(ENDPOINT_ENV, d.endpoint)
        yield d


@pytest.fixture
def config(gcs_bucket: str) -> KineticConfig:
    return KineticConfig(
        backend="gke", bucket=gcs_bucket, project="proj", zone="us-central1-a", cluster="c1"
    )


def bundled(config: KineticConfig, tmp_path: Path, category: str = "cpu") -> ImagePlan:
    (tmp_path / "requirements.txt").write_text("numpy>=1.26\njax==0.4.30\n")
    (tmp_path / "dag.py").write_text("")
    return plan_image(
        container_image=None, requirements=None, entry_file=str(tmp_path / "dag.py"),
        category=category, local=False, config=config,
    )  # fmt: skip


def hook(config: KineticConfig, **kwargs: int) -> ImageBuildHook:
    # The double advances one state per read: no waiting between polls.
    return ImageBuildHook(config, poll_interval=0.0, sleep=lambda _s: None, **kwargs)


def test_cache_hit_builds_nothing(double, config, store, tmp_path):
    plan = bundled(config, tmp_path)
    double.add_tag(plan.uri)
    assert hook(config).ensure(plan, store) is False
    assert double.builds == []
    assert [m for m, _ in double.requests] == ["GET"]  # one get_tag, nothing else
    assert store.list(BUILDS_PREFIX + "/") == []


class Lines(logging.Handler):
    """The hook's log lines (Airflow's logging setup may route records elsewhere), each
    with the number of build reads the double had answered when it was logged."""

    def __init__(self, double: CloudBuildDouble) -> None:
        super().__init__(logging.INFO)
        self.double = double
        self.lines: list[str] = []
        self.polls: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.polls.append(sum(1 for m, p in self.double.requests if m == "GET" and "/builds/" in p))

    def build_log(self) -> list[tuple[int, str]]:
        """(poll, line) of each build-log line shown, in order."""
        prefix = "[cloud build] "
        return [(n, ln.removeprefix(prefix)) for n, ln in zip(self.polls, self.lines, strict=True)
                if ln.startswith(prefix)]  # fmt: skip


@contextlib.contextmanager
def captured(double: CloudBuildDouble) -> Iterator[Lines]:
    logger = logging.getLogger("airflow_provider_kinetic.gcp.image_build")
    lines, level = Lines(double), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


def test_miss_submits_one_build_with_the_docker_step_and_tag(double, config, store, tmp_path):
    plan = bundled(config, tmp_path)
    assert plan.uri == f"us-central1-docker.pkg.dev/proj/kn-c1/base:{plan.tag}"
    with captured(double) as lines:
        assert hook(config).ensure(plan, store) is True
    [build] = double.builds
    assert [(s.name, list(s.args)) for s in build.steps] == [
        (DOCKER_BUILDER, ["build", "--network=cloudbuild", "-t", plan.uri, "."])
    ]
    assert list(build.images) == [plan.uri]
    assert build.timeout.total_seconds() == 1200
    # The request body, parsed strictly into the Build proto: the log goes to the bucket.
    assert build.options.logging.name == "GCS_ONLY"
    assert build.logs_bucket == f"gs://{store.bucket}/{LOGS_PREFIX}"
    assert build.source.storage_source.bucket == store.bucket
    files = double.sources[build.id]
    assert files["Dockerfile"].decode() == plan.dockerfile
    assert files["requirements.txt"] == b"numpy>=1.26\n"  # jax dropped: the image has it
    assert f"dist/{wheel.wheel_name()}" in files
    assert b"airflow_provider_kinetic.runner" in files["remote_runner.py"]
    # The status lines reach the log; the context is gone; the tag now exists.
    assert any(ln.startswith("Cloud Build build-0001: WORKING") for ln in lines.lines)
    assert any(ln.startswith("Cloud Build build-0001: SUCCESS") for ln in lines.lines)
    # Every line of the build's log, once and in order, shown over several polls; the
    # build-log lines come after the build is WORKING and before it is reported built.
    shown = lines.build_log()
    assert [ln for _, ln in shown] == double.logs[build.id].splitlines()
    assert shown[0][1] == 'starting build "build-0001"' and shown[-1][1] == "DONE"
    assert len({n for n, _ in shown}) >= 3
    first = lines.lines.index(f"[cloud build] {shown[0][1]}")
    assert any(ln.startswith("Cloud Build build-0001: WORKING") for ln in lines.lines[:first])
    assert lines.lines[-1].startswith(f"kinetic image {plan.uri} built")
    # The log object was deleted with the context: nothing is left under _builds/.
    assert store.list(BUILDS_PREFIX + "/") == []
    assert hook(config).exists(plan)
    assert hook(config).ensure(plan, store) is False and len(double.builds) == 1


def test_failed_build_is_a_clear_error_with_its_last_log_lines(double, config, store, tmp_path):
    plan = bundled(config, tmp_path, "gpu")
    double.outcome = "failure"
    with captured(double) as lines, pytest.raises(ImageBuildError, match="ended FAILURE") as err:
        hook(config).ensure(plan, store)
    [build] = double.builds
    message = str(err.value)
    assert err.value.log_url == build.log_url and build.log_url in message
    assert plan.uri in message
    # The log's last 20 lines close the message, after the URLs; all are in the task log.
    log_key = f"{LOGS_PREFIX}/log-{build.id}.txt"
    head, tail = message.split("\nlast 20 line(s) of the build log:\n")
    assert head.endswith(f"build log: {build.log_url} ({store.uri(log_key)})")
    written = double.logs[build.id].splitlines()
    assert len(written) > 20
    assert tail.split("\n") == ["  " + ln for ln in written[-20:]]
    assert tail.endswith("failed: step exited with non-zero status: 1")
    assert [ln for _, ln in lines.build_log()] == written
    assert not hook(config).exists(plan)
    # The context is gone; the failed build's log stays, for the console's log view.
    assert store.list(BUILDS_PREFIX + "/") == [log_key]
    assert store.read_bytes(log_key).decode() == double.logs[build.id]


def test_log_lines_are_whole_and_bounded_per_poll(double, config, store, tmp_path):
    plan = bundled(config, tmp_path)
    # Cloud Build rewrites the object with whatever it has: here a line is cut in two
    # and the log ends without a newline.
    double.log_pieces = ["a1\na2\na3\na4\na5\n", "b1\nb2 par", "tial\nDONE"]
    with captured(double) as lines:
        assert hook(config, log_lines_per_poll=2).ensure(plan, store) is True
    shown = lines.build_log()
    assert [ln for _, ln in shown] == ["a1", "a2", "a3", "a4", "a5", "b1", "b2 partial", "DONE"]
    # While the build runs, each poll shows at most 2 lines, the rest on later polls.
    per_poll = [sum(1 for n, _ in shown if n == poll) for poll in range(1, 5)]
    assert per_poll == [2, 2, 2, 2]  # read 4 sees the end: the rest is shown then


def test_categories_get_distinct_tags_and_equal_inputs_the_same(config, tmp_path):
    plans = {c: bundled(config, tmp_path, c) for c in ("cpu", "gpu", "tpu")}
    assert len({p.uri for p in plans.values()}) == 3
    assert all(p.tag.startswith(f"{c}-") and len(p.tag) == len(c) + 13 for c, p in plans.items())
    assert bundled(config, tmp_path, "cpu").uri == plans["cpu"].uri
    (tmp_path / "requirements.txt").write_text("numpy>=2\n")
    changed = plan_image(container_image=None, requirements=None,
                         entry_file=str(tmp_path / "dag.py"), category="cpu", local=False,
                         config=config)  # fmt: skip
    assert changed.tag != plans["cpu"].tag


def _dry_conn(monkeypatch: pytest.MonkeyPatch, gcs_bucket: str) -> str:
    extras = {"backend": "gke", "bucket": gcs_bucket, "project": "proj", "cluster": "c1",
              "zone": "us-central1-a", "endpoint": {"host": "https://x"}}  # fmt: skip
    return set_conn(monkeypatch, "kn_dry", extras)


def _square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("operator", ["run", "map"])
def test_dry_run_shows_the_image_and_whether_it_would_be_built(
    double, monkeypatch, gcs_bucket, capsys, operator
):
    import yaml

    from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator

    conn = _dry_conn(monkeypatch, gcs_bucket)
    common = {"task_id": "t", "python_callable": _square, "kinetic_conn_id": conn,
              "requirements": ["six"]}  # fmt: skip
    if operator == "run":
        op = KineticRunOperator(op_args=[3], **common)
    else:
        op = KineticMapOperator(inputs=[1, 2], **common)
    manifest = op.dry_run()
    out = capsys.readouterr().out
    uri = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
    assert f"# image: bundled image {uri} (1 requirement(s))" in out
    assert "# image status: would be built with Cloud Build" in out
    assert yaml.safe_load(out) == manifest  # the report lines are YAML comments
    double.add_tag(uri)
    op.dry_run()
    assert "# image status: exists" in capsys.readouterr().out
    assert double.builds == []  # a dry run never builds


def test_a_line_longer_than_a_read_is_shown_in_pieces(store):
    store.write_bytes("logs/log-b.txt", b"x" * 300 + b"\nend\n")
    logger = logging.getLogger("airflow_provider_kinetic.gcp.image_build")
    tail = BuildLogTail(store.client, store.bucket, "logs/log-b.txt", logger, max_bytes=128)
    assert [tail.poll() for _ in range(4)] == [1, 1, 2, 0]  # the third read reaches the end
    assert tail.last_lines == ["x" * 128, "x" * 128, "x" * 44, "end"]
    assert tail.poll(final=True) == 0 and tail.offset == 305
    # After the build, drain() says whether its reads got to the end of the log.
    again = BuildLogTail(store.client, store.bucket, "logs/log-b.txt", logger, max_bytes=128)
    assert again.drain(max_reads=2) is False and again.offset == 256
    assert again.drain() is True and again.last_lines == tail.last_lines
    tail.delete()
    assert not store.exists("logs/log-b.txt")


def test_an_unreadable_log_is_reported_once_and_left_alone(caplog):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = storage.Client(project="p", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": dead})  # fmt: skip
    logger = logging.getLogger("airflow_provider_kinetic.gcp.image_build")
    tail = BuildLogTail(client, "b", "logs/log-1.txt", logger, retry_s=0.5)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        assert tail.poll() == 0 and tail.poll() == 0
        tail.drain()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 1
        and "cannot read the Cloud Build log gs://b/logs/log-1.txt" in warnings[0]
    )
    assert tail.last_lines == []
