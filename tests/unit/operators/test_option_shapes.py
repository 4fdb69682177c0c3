"""Options given in the shape a user writes them: one name for a list of names, and
templated fields that render to the wrong type fail naming the field.

Planned through the operators' own code against a GKE connection (no credentials,
nothing uploaded), as ``test_option_propagation.py`` does.
"""

from __future__ import annotations

import pytest

from airflow_provider_kinetic import KineticMapOperator, KineticRunOperator
from airflow_provider_kinetic.core.jobs.request import capture_env, names_option
from tests.unit.operators.test_option_propagation import IDENTITY, conn, planned, work  # noqa: F401


def test_one_capture_name_is_one_variable_not_its_characters(conn, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WANDB_API_KEY", "k-123")
    monkeypatch.setenv("_", "/usr/bin/env")  # what the character-by-character read forwarded
    for op in (
        KineticRunOperator(
            task_id="run", python_callable=work, kinetic_conn_id=conn,
            capture_env_vars="WANDB_API_KEY",
        ),
        KineticMapOperator(
            task_id="map", python_callable=work, inputs=[1, 2, 3], kinetic_conn_id=conn,
            capture_env_vars="WANDB_API_KEY",
        ),
    ):  # fmt: skip
        spec, payload, _ = planned(op)
        captured = {
            k: v
            for k, v in spec.secrets.items()
            if k not in ("KINETIC_RESULT_KEY", "KINETIC_PEER_TOKEN")  # made at submit
        }
        assert captured == {"WANDB_API_KEY": "k-123"}
        assert "_" not in spec.secrets and "WANDB_API_KEY" not in payload["env_vars"]


def test_list_of_names_options_take_one_name_or_fail_naming_the_option():
    assert names_option("A", "capture_env_vars") == ["A"]
    assert names_option(["A", "B*"], "capture_env_vars") == ["A", "B*"]
    assert names_option(None, "capture_env_vars") == []
    assert capture_env("ONLY", environ={"ONLY": "1", "O": "x", "N": "y"}) == {"ONLY": "1"}
    with pytest.raises(TypeError, match="capture_env_vars must be a name or a list of names"):
        names_option({"A": 1}, "capture_env_vars")
    op = KineticRunOperator(task_id="t", python_callable=work, context_excludes="*.ckpt")
    assert op.context_excludes == ["*.ckpt"]


@pytest.mark.parametrize(
    ("field", "rendered"),
    [("op_kwargs", "{'lr': 0.1}"), ("volumes", "{'/mnt': 'x'}"), ("op_args", "[1, 2]")],
)
def test_a_templated_mapping_rendered_to_text_fails_naming_the_field(conn, field, rendered):  # noqa: F811
    op = KineticRunOperator(task_id="t", python_callable=work, kinetic_conn_id=conn)
    setattr(op, field, rendered)  # what "{{ dag_run.conf }}" renders to without native rendering
    with pytest.raises(TypeError) as err:
        op.build_request(IDENTITY, lambda key: f"gs://bkt/{key}")
    message = str(err.value)
    assert message.startswith(f"{field} must be") and "got str" in message
    assert "render_template_as_native_obj" in message


def test_map_inputs_rendered_to_text_fail_naming_the_field(conn):  # noqa: F811
    op = KineticMapOperator(
        task_id="m", python_callable=work, inputs="[1, 2]", kinetic_conn_id=conn
    )
    with pytest.raises(
        TypeError, match="inputs must be a list or tuple.*render_template_as_native_obj"
    ):
        op.execute({"ti": None})
