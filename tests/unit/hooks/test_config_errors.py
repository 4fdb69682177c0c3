"""Configuration errors are errors: raised before anything is uploaded, naming the bad value
and what is allowed.  Connections are real Airflow connections (``AIRFLOW_CONN_*``)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.providers.common.compat.sdk import AirflowNotFoundException

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.config import (
    KineticConfig,
    KineticConfigError,
    bucket_name_problem,
)
from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.hooks.kinetic import (
    KineticConnectionNotFound,
    KineticHook,
    config_from_extras,
)
from tests.fixtures.local_conn import set_conn

GKE = {"backend": "gke", "project": "proj", "zone": "z", "cluster": "c1"}


def train(x: int = 0) -> int:
    return x


# ---- extras that are not JSON -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ('{"backend": "gke", bucket: "x"}', "are not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"gke"', "must be a JSON object, not str"),
    ],
)
def test_extras_that_are_not_a_json_object_are_an_error(monkeypatch, extra, says):
    """They used to read as {} -- the local backend, running training on the worker."""
    conn_id = set_conn(monkeypatch, "kn_bad_json", extra)
    with pytest.raises(KineticConfigError, match=f"connection 'kn_bad_json' {says}") as info:
        KineticHook(conn_id).get_config()
    assert extra[:20] in str(info.value)  # shows what it read
    assert isinstance(info.value, ValueError) and isinstance(info.value, KineticError)


def test_extras_in_a_connection_uri_are_checked_too(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KN_URI", "kinetic://?__extra__=%7Bbackend%3A+gke")
    with pytest.raises(KineticConfigError, match="'kn_uri' are not valid JSON.*'{backend: gke'"):
        KineticHook("kn_uri").get_config()


def test_endpoint_extra_that_is_not_json(monkeypatch):
    conn_id = set_conn(monkeypatch, "kn_ep", {**GKE, "bucket": "jobs-1", "endpoint": "10.0.0.1"})
    with pytest.raises(KineticConfigError, match="extra 'endpoint' of connection 'kn_ep'"):
        KineticHook(conn_id).get_config()


# ---- unknown extras ---------------------------------------------------------------------------


def test_unknown_extra_names_the_closest_known_one(monkeypatch, tmp_path):
    conn_id = set_conn(monkeypatch, "kn_typo", {**GKE, "bukcet": "my-jobs"})
    with pytest.raises(KineticConfigError) as info:
        KineticHook(conn_id).get_config()
    message = str(info.value)
    assert "connection 'kn_typo' has unknown extra 'bukcet' (did you mean 'bucket'?)" in message
    assert "known extras: gcp_conn_id," in message and "namespace" in message


def test_several_unknown_extras_form_keys_included():
    with pytest.raises(KineticConfigError) as info:
        config_from_extras({"extra__kinetic__namespce": "ml", "xyzzy": 1, **GKE})
    message = str(info.value)
    assert "unknown extras 'extra__kinetic__namespce' (did you mean 'namespace'?), 'xyzzy';" in (
        message
    )


def test_known_extras_in_both_spellings_still_work(tmp_path):
    config = config_from_extras({"extra__kinetic__root": str(tmp_path / "r"), "backend": "local"})
    assert config.root == str(tmp_path / "r") and config.extra == {}


# ---- a named connection that does not exist ---------------------------------------------------


def test_missing_named_connection(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_PROD", raising=False)
    with pytest.raises(KineticConnectionNotFound) as info:
        KineticHook("kinetic_prod").get_config()
    message = str(info.value)
    assert "the kinetic connection 'kinetic_prod' does not exist" in message
    assert "AIRFLOW_CONN_KINETIC_PROD" in message
    # still what Airflow code and the old behaviour catch
    assert isinstance(info.value, AirflowNotFoundException)
    assert isinstance(info.value, KineticConfigError)


# ---- the only fallback: a missing kinetic_default --------------------------------------------


def test_missing_default_falls_back_with_a_warning(monkeypatch, tmp_path, caplog, capsys):
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING):
        config = KineticHook().get_config()
    assert config.backend == "local" and config.bucket_name == str(tmp_path / "kinetic")
    logged = caplog.text + capsys.readouterr().out
    assert "No 'kinetic_default' connection: jobs run ON THIS MACHINE" in logged
    assert "warning" in logged.lower() and "allow_local_fallback = False" in logged


def test_the_fallback_warning_is_given_once_per_process(monkeypatch, tmp_path, caplog, capsys):
    """A task makes hooks at every step (plan, polls, collect, cleanup): its log gets
    the missing-connection warning once, not once per hook."""
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING):
        configs = [KineticHook().get_config() for _ in range(4)]
    assert {c.bucket_name for c in configs} == {str(tmp_path / "kinetic")}
    logged = caplog.text + capsys.readouterr().out
    assert logged.count("No 'kinetic_default' connection: jobs run ON THIS MACHINE") == 1


def test_read_only_hooks_fall_back_without_the_on_this_machine_warning(
    monkeypatch, tmp_path, caplog, capsys
):
    """Read-only CLI commands make their hooks inside ``reading_only()`` (cli/__init__):
    they run no job, so the local fallback does not warn that jobs run here."""
    from airflow_provider_kinetic.cli import get_kinetic_cli_commands
    from airflow_provider_kinetic.hooks.kinetic import reading_only

    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_DEFAULT", raising=False)
    monkeypatch.delenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with caplog.at_level(logging.DEBUG):
        quiet = KineticHook(read_only=True).get_config()
        with reading_only():
            inside = KineticHook()
        loud = KineticHook(read_only=False)
    assert quiet.bucket_name == inside.get_config().bucket_name == str(tmp_path / "kinetic")
    assert (inside.read_only, loud.read_only, KineticHook().read_only) == (True, False, False)
    logged = caplog.text + capsys.readouterr().out
    assert "ON THIS MACHINE" not in logged
    loud.get_config()
    assert "ON THIS MACHINE" in caplog.text + capsys.readouterr().out

    # Which commands are wired as read-only (the wrapper runs them in reading_only()).
    (group,) = get_kinetic_cli_commands()
    commands = {
        (g.name, c.name) if c is not g else (c.name,): c
        for g in group.subcommands
        for c in (getattr(g, "subcommands", None) or (g,))
    }
    quiet_names = {n for n, c in commands.items() if c.func.__qualname__.startswith("read_only")}
    assert quiet_names == {
        ("jobs", "list"), ("jobs", "status"), ("jobs", "logs"), ("jobs", "result"),
        ("jobs", "debug"), ("data", "ls"), ("store", "ls"), ("cache", "ls"),
        ("accelerators",), ("usage",),
    }  # fmt: skip
    assert len(commands) > len(quiet_names)  # cancel, cleanup, gc: not read-only


@pytest.mark.parametrize("value", ["False", "false", "0"])
def test_fallback_can_be_forbidden(monkeypatch, tmp_path, value):
    monkeypatch.delenv("AIRFLOW_CONN_KINETIC_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", value)
    with pytest.raises(KineticConnectionNotFound) as info:
        KineticHook().get_config()
    assert "no 'kinetic_default' connection and [kinetic] allow_local_fallback is False" in str(
        info.value
    )
    assert not (tmp_path / "kinetic").exists()  # nothing was set up on this machine


def test_forbidding_the_fallback_leaves_a_real_default_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__KINETIC__ALLOW_LOCAL_FALLBACK", "False")
    set_conn(monkeypatch, "kinetic_default", {"root": str(tmp_path / "r")})
    assert KineticHook().get_config().bucket_name == str(tmp_path / "r")


# ---- bucket names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("My-Jobs", "uppercase letters are not allowed"),
        ("jobs bucket", "it contains ' '"),
        ("ab", "it has 2 characters \\(at least 3\\)"),
        ("x" * 64, "it has 64 characters \\(at most 63\\)"),
        ("a." + "b" * 64, "has 64 characters \\(at most 63\\)"),
        (".".join(["a" * 60] * 4), "it has 243 characters \\(at most 222 with dots\\)"),
        ("-jobs", "start and end with a letter or digit"),
        ("jobs_", "start and end with a letter or digit"),
        ("goog-jobs", "it starts with 'goog'"),
        ("my-google-jobs", "it contains 'google'"),
        ("192.168.5.4", "it is an IP address"),
        ("gs://my-jobs/prefix", "give the bare name 'my-jobs', without 'gs://'"),
    ],
)
def test_invalid_bucket_names_are_named_with_the_rules(name, reason):
    with pytest.raises(KineticConfigError, match=reason) as info:
        config_from_extras({**GKE, "bucket": name})
    message = str(info.value)
    assert f"invalid GCS bucket name {name!r} (the 'bucket' setting)" in message
    assert "3-63 characters" in message and "lowercase letters, digits" in message
    with pytest.raises(KineticConfigError, match=reason):
        KineticConfig(backend="gke", bucket=name)  # core code gets the same check


@pytest.mark.parametrize(
    "name", ["abc", "my-jobs_2", "x" * 63, "jobs.example.com", ".".join(["a" * 63] * 3) + ".ab"]
)
def test_valid_bucket_names(name):
    assert bucket_name_problem(name) is None
    assert KineticConfig(backend="gke", bucket=name).bucket_name == name


def test_a_derived_bucket_name_is_checked_and_says_where_it_came_from():
    extras = {**GKE, "project": "a-long-project-name-123", "cluster": "a-long-cluster-name-" * 2}
    with pytest.raises(KineticConfigError) as info:
        config_from_extras(extras)
    message = str(info.value)
    assert "'a-long-project-name-123-kn-a-long-cluster-name-a-long-cluster-name--jobs'" in message
    assert "the gke backend derives" in message and "set 'bucket'" in message


def test_local_backend_ignores_the_bucket_setting(tmp_path):
    config = KineticConfig(backend="local", root=str(tmp_path / "r"), bucket="NOT A BUCKET")
    assert config.bucket_name == str(tmp_path / "r")


# ---- local roots --------------------------------------------------------------------------------


def _writable(path: Path) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=path)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write: mode 0555, or (root ignores modes) sysfs."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    sysfs = Path("/sys/kernel")
    if not sysfs.is_dir() or _writable(sysfs):
        pytest.skip("running as root without a read-only directory to test with")
    yield sysfs


def test_a_missing_root_is_created(monkeypatch, tmp_path):
    root = tmp_path / "not" / "yet" / "there"
    conn_id = set_conn(monkeypatch, "kn_new_root", {"root": str(root)})
    config = KineticHook(conn_id).get_config()
    assert root.is_dir() and config.bucket_name == str(root)
    assert os.listdir(root) == []  # the write probe is gone


def test_a_root_that_cannot_be_written_is_an_error(monkeypatch, unwritable_dir):
    conn_id = set_conn(monkeypatch, "kn_ro_root", {"root": str(unwritable_dir)})
    with pytest.raises(KineticConfigError) as info:
        KineticHook(conn_id).get_config()
    message = str(info.value)
    assert f"local store root {str(unwritable_dir)!r} is not writable" in message
    assert "set 'root' to a directory this machine can write" in message


def test_a_root_whose_parent_cannot_be_written_is_an_error(unwritable_dir):
    root = unwritable_dir / "kinetic"
    with pytest.raises(KineticConfigError) as info:
        KineticConfig(backend="local", root=str(root))
    message = str(info.value)
    assert f"local store root {str(root)!r} does not exist and cannot be created" in message
    assert f"(in {str(unwritable_dir)!r})" in message
    assert not root.exists()


def test_a_root_under_a_file_is_an_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    root = tmp_path / "a-file" / "root"
    with pytest.raises(KineticConfigError, match="does not exist and cannot be created: Not a dir"):
        KineticConfig(backend="local", root=str(root))


def test_a_root_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(KineticConfigError, match="'.*a-file' is not a directory"):
        KineticConfig(backend="local", root=str(tmp_path / "a-file"))


# ---- before anything is uploaded --------------------------------------------------------------


def test_the_operator_fails_before_any_upload(monkeypatch, tmp_path):
    """A bad bucket on a GKE connection: the error is the config's, not a failed upload
    (any GCS request would go to a closed port) and nothing of the input was read."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    conn_id = set_conn(monkeypatch, "kn_op", {**GKE, "bucket": "Jobs"})
    op = KineticRunOperator(
        task_id="t", python_callable=train, accelerator="cpu", kinetic_conn_id=conn_id
    )
    with pytest.raises(KineticConfigError, match="invalid GCS bucket name 'Jobs'"):
        op.execute({})
    conn_id = set_conn(monkeypatch, "kn_op2", {"root": str(tmp_path / "r"), "imgae": "x"})
    op = KineticRunOperator(
        task_id="t", python_callable=train, accelerator="cpu", kinetic_conn_id=conn_id
    )
    with pytest.raises(KineticConfigError, match="'imgae' \\(did you mean 'image'\\?\\)"):
        op.execute({})
    assert not (tmp_path / "r").exists()


def test_a_bad_data_layout_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(KineticConfigError, match=r"data_layout='tree' is not one of 'files'"):
        KineticConfig(backend="local", root=str(tmp_path), data_layout="tree")
    store = KineticConfig(backend="local", root=str(tmp_path), data_layout="kinetic").store()
    assert store.data_layout == "kinetic"
