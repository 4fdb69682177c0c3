"""Every parameter of the operators and sensors is in their own signature and
docstring (``:param name:``, the Airflow providers' convention): a DAG author reading
``KineticMapOperator`` finds ``broadcast`` there, not in a base class's ``**kwargs``."""

from __future__ import annotations

import inspect

import pytest

from airflow_provider_kinetic import (
    KineticBatchSensor,
    KineticJobSensor,
    KineticMapOperator,
    KineticRunOperator,
)

CLASSES = [KineticRunOperator, KineticMapOperator, KineticJobSensor, KineticBatchSensor]
NOT_PARAMETERS = {"self", "args", "kwargs"}


def own_params(cls: type) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items() if n not in NOT_PARAMETERS}


def package_bases(cls: type) -> list[type]:
    """The classes ``cls`` inherits from this package that take parameters of their own
    (Airflow's ``BaseOperator`` / ``BaseSensorOperator`` are documented by Airflow)."""
    return [
        base
        for base in cls.__mro__[1:]
        if base.__module__.startswith("airflow_provider_kinetic.") and "__init__" in vars(base)
    ]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_init_parameter_is_a_param_of_the_class_docstring(cls):
    doc = inspect.getdoc(cls) or ""
    missing = [name for name in own_params(cls) if f":param {name}:" not in doc]
    assert missing == [], f"{cls.__name__}: no ':param NAME:' for {missing}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_base_class_parameters_are_in_the_class_signature(cls):
    mine = own_params(cls)
    for base in package_bases(cls):
        theirs = own_params(base)
        assert sorted(set(theirs) - set(mine)) == [], f"{cls.__name__} hides {base.__name__}'s"
        # The same defaults: listing a parameter again changes nothing it did.
        changed = [n for n, p in theirs.items() if mine[n].default != p.default]
        assert changed == [], f"{cls.__name__}: defaults differ from {base.__name__}'s"


def test_map_operator_names_broadcast_and_group_name():
    params = own_params(KineticMapOperator)
    assert params["broadcast"].default is False and params["group_name"].default is None
