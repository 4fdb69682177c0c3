"""``cache=``, ``cache_version=``, ``cache_ignore=``: bad input fails when the DAG is
parsed (the operator's ``__init__``) naming the value and what is allowed; the reuse
key is the work digest of the call less the ignored arguments."""

from __future__ import annotations

import re

import pytest

from airflow_provider_kinetic import KineticRunOperator
from airflow_provider_kinetic.core.jobs.work import named_call, reuse_key


def train(data, lr=0.1, seed=0):
    return data, lr, seed


def op(**kw):
    return KineticRunOperator(task_id="t", python_callable=train, **kw)


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        ({"cache": "yes"}, TypeError, "allowed values are True and False"),
        ({"cache": True, "cache_version": 2}, TypeError, "must be a string"),
        ({"cache": True, "cache_ignore": "seed"}, TypeError, "list of the function's argument"),
        ({"cache": True, "cache_ignore": ["epochs"]}, ValueError, "'data', 'lr', 'seed'"),
        ({"cache_version": "2"}, ValueError, "only with cache=True"),
        ({"cache": True, "wait_for_completion": False}, ValueError, "wait_for_completion=True"),
    ],
)
def test_bad_cache_settings_fail_at_parse_time(kw, error, words):
    with pytest.raises(error, match=re.escape(words)):
        op(**kw)


def test_good_cache_settings():
    settings = op(cache=True, cache_version="2", cache_ignore=["seed"]).cache_settings
    assert settings is not None and settings.version == "2" and settings.ignore == ("seed",)
    assert op().cache_settings is None  # off by default


def test_the_call_by_name_less_the_ignored_arguments():
    assert named_call(train, (1,), {"seed": 3}, ["seed"]) == {"data": 1}
    assert named_call(train, (1, 0.2), {}, ()) == named_call(train, (), {"data": 1, "lr": 0.2}, ())


def test_reuse_key_follows_the_digest_and_the_version():
    assert reuse_key("a" * 64, "") == reuse_key("a" * 64, "")
    assert reuse_key("a" * 64, "") != reuse_key("a" * 64, "2")
    assert reuse_key("unsure-x (y)", "") is None  # never reused


def test_task_kinetic_takes_the_cache_settings_and_checks_them():
    from airflow.sdk import DAG

    from airflow_provider_kinetic.decorators.kinetic import kinetic_task

    with DAG("cache_params"):

        @kinetic_task(cache=True, cache_version="3", cache_ignore=["seed"])
        def fit(data, seed=0):
            return data

        made = fit(1)
        with pytest.raises(ValueError, match="'data', 'seed'"):
            kinetic_task(cache=True, cache_ignore=["epochs"])(fit.function)(1)
    settings = made.operator.cache_settings
    assert settings.version == "3" and settings.ignore == ("seed",)
