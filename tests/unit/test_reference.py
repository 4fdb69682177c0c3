"""docs/REFERENCE.md documents every __init__ parameter of the public operators,
the sensor and the decorator, every connection extra and every [kinetic] option."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from airflow_provider_kinetic import (
    KineticBatchSensor,
    KineticJobSensor,
    KineticMapOperator,
    KineticRunOperator,
)
from airflow_provider_kinetic.decorators.kinetic import KineticDecoratedOperator
from airflow_provider_kinetic.operators.common import KineticOperatorBase

REFERENCE = (Path(__file__).parents[2] / "docs" / "REFERENCE.md").read_text()


def section(title: str) -> str:
    start = REFERENCE.index(f"## {title}")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start : end if end != -1 else None]


def params(cls: type) -> set[str]:
    return {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")}


@pytest.mark.parametrize(
    ("cls", "title"),
    [
        (KineticOperatorBase, "Shared by KineticRunOperator"),
        (KineticRunOperator, "KineticRunOperator (and @task.kinetic)"),
        (KineticDecoratedOperator, "KineticRunOperator (and @task.kinetic)"),
        (KineticMapOperator, "KineticMapOperator"),
        (KineticJobSensor, "KineticJobSensor"),
        (KineticBatchSensor, "KineticBatchSensor"),
    ],
)
def test_every_parameter_is_documented(cls, title):
    text = section(title)
    if issubclass(cls, KineticOperatorBase):  # their shared parameters: one table
        text += section("Shared by KineticRunOperator")
    documented = set(re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE))
    assert params(cls) - documented == set(), title


def test_every_extra_and_option_is_documented():
    from airflow_provider_kinetic.deployment.connection import _EXTRA_FIELDS
    from airflow_provider_kinetic.provider_info import CONFIG

    extras = section("Connection extras")
    assert [e for e in _EXTRA_FIELDS if f"`{e}`" not in extras] == []
    options = section("`[kinetic]` options")
    assert [o for o in CONFIG if f"`{o}`" not in options] == []
