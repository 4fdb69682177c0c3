"""Keys as inputs and outputs, below Airflow's runs: ``output_key`` refused at parse
time, on ``@task.kinetic`` too; ``publish_output`` never makes a second version of
the same content for the same task instance; ``kinetic://`` Data in ``submit_job``
pack as the version's cache entry (nothing uploaded) or fail before anything moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.config import KineticConfig
from airflow_provider_kinetic.core.data import Data
from airflow_provider_kinetic.core.data.refs import cache_key
from airflow_provider_kinetic.core.jobs.request import JobRequest
from airflow_provider_kinetic.core.jobs.submit import plan_job
from airflow_provider_kinetic.core.keys.keystore import KeyStore
from airflow_provider_kinetic.core.keys.names import KeyNameError, KeyNotFound
from airflow_provider_kinetic.core.keys.publish import OutputKeyError, publish_output
from airflow_provider_kinetic.core.storage import LocalStore, file_uri

WHO = {"dag_id": "d", "task_id": "t", "run_id": "r1", "map_index": -1}


def f() -> int:
    return 1


@pytest.mark.parametrize("bad", ["../up", "/abs", "a@b", "sp ace", ""])
def test_a_bad_output_key_fails_when_the_dag_is_parsed(bad: str) -> None:
    if bad == "":
        assert KineticRunOperator(task_id="t", python_callable=f, output_key="").output_key is None
        return
    with pytest.raises(KeyNameError, match=rf"task 't': output_key: key {bad!r}"):
        KineticRunOperator(task_id="t", python_callable=f, output_key=bad)


def test_output_key_is_templated_on_the_operator_and_the_decorator() -> None:
    from airflow.sdk import DAG, task

    op = KineticRunOperator(task_id="t", python_callable=f, output_key="models/{{ ds }}")
    assert "output_key" in op.template_fields and op.output_key == "models/{{ ds }}"
    with DAG("keyio_unit", schedule=None):

        @task.kinetic(output_key="models/churn")
        def train() -> int:
            return 1

        made = train()
    assert made.operator.output_key == "models/churn"
    assert "output_key" in made.operator.template_fields
    with pytest.raises(KeyNameError, match="output_key"), DAG("keyio_unit_bad", schedule=None):

        @task.kinetic(output_key="models/../x")
        def bad() -> int:
            return 1

        bad()


def _out(tmp_path: Path, name: str, text: str) -> str:
    out = tmp_path / name
    out.mkdir()
    (out / "w.txt").write_text(text)
    return file_uri(str(out))


def test_publish_output_is_idempotent_per_task_instance(tmp_path: Path) -> None:
    keys = KeyStore(LocalStore(str(tmp_path / "root")))
    first = publish_output(keys, "models/churn", _out(tmp_path, "o1", "v1"), WHO)
    assert first["new"] is True and first["by"] == WHO
    # A retry collecting the same job: the same content, no new version.
    again = publish_output(keys, "models/churn", _out(tmp_path, "o2", "v1"), WHO)
    assert again["new"] is False and again["version"] == first["version"]
    # Someone moved the key on meanwhile; this task's retry still adds nothing.
    (tmp_path / "other").write_text("other")
    moved = keys.put("models/churn", tmp_path / "other")
    retry = publish_output(keys, "models/churn", _out(tmp_path, "o3", "v1"), WHO)
    assert retry["new"] is False
    state = keys.state("models/churn")
    assert state is not None
    assert [v.version for v in state.versions] == [moved["version"], first["version"]]
    # Another run with the same content (not current): a new version on top.
    other_run = {**WHO, "run_id": "r2"}
    later = publish_output(keys, "models/churn", _out(tmp_path, "o4", "v1"), other_run)
    assert later["new"] is True and keys.state("models/churn").current.by == other_run
    with pytest.raises(OutputKeyError, match="wrote nothing"):
        publish_output(keys, "models/empty", file_uri(str(tmp_path / "missing")), WHO)
    assert keys.state("models/empty") is None


def test_kinetic_data_packs_as_the_versions_cache_entry(tmp_path: Path) -> None:
    config = KineticConfig(backend="local", root=str(tmp_path / "root"))
    store = config.store()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.txt").write_text("w")
    put = KeyStore(store).put("models/churn", tmp_path / "m")
    request = JobRequest(func=f, args=(Data("kinetic://models/churn"),))
    planned = plan_job(request, config, store, "job-keyio0001")
    assert planned.packed.local_data == []  # nothing to hash or upload
    assert planned.handle.extra["data_hashes"] == [put["version"]]
    assert store.uri(cache_key(put["version"])) in planned.packed.payload.decode("latin-1")
    bad = JobRequest(func=f, args=(Data("kinetic://models/chrun"),))
    with pytest.raises(KeyNotFound, match="nearest keys: models/churn"):
        plan_job(bad, config, store, "job-keyio0002")
    with pytest.raises(KeyNameError, match=r"op_args\[0\]: key 'models/\.\./x'"):
        plan_job(JobRequest(func=f, args=(Data("kinetic://models/../x"),)), config, store, "j")


@pytest.mark.parametrize("how", ["output_key", "store.put"])
def test_a_publish_of_unchanged_content_renews_the_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A daily task whose output is the same each day keeps its key alive: the
    publish renews the ttl (the expiry ``data gc`` reads) without a new version."""
    from types import SimpleNamespace

    from airflow_provider_kinetic.core.keys import gc as keys_gc
    from airflow_provider_kinetic.core.keys import keystore

    now = [1_000_000.0]
    monkeypatch.setattr(keystore, "time", SimpleNamespace(time=lambda: now[0]))
    keys = KeyStore(LocalStore(str(tmp_path / "root")))
    day = 86_400.0
    first = publish_output(keys, "models/daily", _out(tmp_path, "o1", "same"), WHO)
    keys.put("models/daily", tmp_path / "o1", ttl="2d")  # the same content, a ttl
    assert keys.state("models/daily").expires_at == now[0] + 2 * day
    for n in range(2, 5):  # one publish a day, the same bytes each time
        now[0] += day
        if how == "output_key":
            run = {**WHO, "run_id": f"r{n}"}
            row = publish_output(keys, "models/daily", _out(tmp_path, f"o{n}", "same"), run)
        else:
            row = keys.put("models/daily", tmp_path / "o1")
        assert row["version"] == first["version"]
        state = keys.state("models/daily")
        assert [v.version for v in state.versions] == [first["version"]]  # no new version
        assert state.expires_at == now[0] + 2 * day
    later = now[0] + 1.5 * day  # past the first put's ttl, within the last one's
    assert keys_gc.expire(keys, later) == []
    assert keys_gc.referenced_hashes(keys, later) == {first["version"]}
    assert [s.key for s in keys_gc.expire(keys, now[0] + 2 * day)] == ["models/daily"]
