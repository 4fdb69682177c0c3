"""``[kinetic] price_table`` (``deployment/prices.py``): the CSV read into the table usage is
priced with, both spellings of a family, and a bad file failing with its name and line;
no table set, no table (so nothing shows a cost)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_provider_kinetic.deployment.prices import (
    PriceTableError,
    family,
    load_price_table,
    parse_price_table,
    read_price_table,
)

HEADER = "accelerator,capacity,usd_per_chip_hour\n"


def test_both_spellings_aliases_and_named_capacities():
    text = (
        "# list prices, 2026-11\n" + HEADER + "tpu-v6e,on-demand,2.70\n"
        "v6e,spot,1.10\n\n"
        "tpu-v5e,reservation:my-res,1.20\n"
        "nvidia-h100-80gb,*,9.80\n"
        " a100-80gb , flex-start , 3 \n"
    )
    assert parse_price_table(text, "t.csv") == {
        "tpu-v6e": {"on-demand": 2.7, "spot": 1.1},
        "tpu-v5litepod": {"reservation:my-res": 1.2},
        "gpu-h100": {"*": 9.8},
        "gpu-a100-80gb": {"flex-start": 3.0},
    }
    assert [family(n) for n in ("h100", "gpu-h100", "v5litepod", "cpu", "tpu-h100")] == [
        "gpu-h100", "gpu-h100", "tpu-v5litepod", None, None,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("", "the first row must be the header"),
        ("accelerator,price\nv6e,1\n", "the first row must be the header"),
        (HEADER + "# ok\nv6e,spto,1\n", "line 3 ('v6e,spto,1'): unknown capacity 'spto'"),
        (HEADER + "v6e,queue:,1\n", "unknown capacity 'queue:'"),
        (HEADER + "v99,spot,1\n", "line 2 ('v99,spot,1'): unknown accelerator 'v99'"),
        (HEADER + "cpu,spot,1\n", "CPUs have no chips"),
        (HEADER + "v6e,spot\n", "line 2 ('v6e,spot'): expected 3 columns"),
        (HEADER + "v6e,spot,-1\n", "'-1' is not a price"),
        (HEADER + "v6e,spot,inf\n", "'inf' is not a price"),
        (HEADER + "v6e,spot,$1\n", "'$1' is not a price"),
        (
            HEADER + "v6e,spot,1\ntpu-v6e,spot,2\n",
            "line 3 ('tpu-v6e,spot,2'): tpu-v6e on spot is priced twice",
        ),
    ],
)
def test_a_bad_file_names_itself_and_its_line(tmp_path: Path, body: str, says: str):
    path = tmp_path / "prices.csv"
    path.write_text(body)
    with pytest.raises(PriceTableError) as caught:
        read_price_table(path)
    assert str(caught.value).startswith(f"price table {path}")
    assert says in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI's one-line errors catch it


def test_the_config_option_names_the_table(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.delenv("AIRFLOW__KINETIC__PRICE_TABLE", raising=False)
    assert load_price_table() is None  # not set: no table, no cost anywhere
    path = tmp_path / "prices.csv"
    path.write_text(HEADER + "v6e,spot,1.5\n")
    monkeypatch.setenv("AIRFLOW__KINETIC__PRICE_TABLE", str(path))
    assert load_price_table() == {"tpu-v6e": {"spot": 1.5}}
    path.write_text(HEADER + "v6e,spot,cheap\n")
    with pytest.raises(PriceTableError, match="line 2"):
        load_price_table()
    with caplog.at_level(logging.WARNING, logger="airflow_provider_kinetic.deployment.prices"):
        assert load_price_table(strict=False) is None  # a task's usage line goes on
    assert "'cheap' is not a price" in caplog.text
    monkeypatch.setenv("AIRFLOW__KINETIC__PRICE_TABLE", str(tmp_path / "missing.csv"))
    with pytest.raises(PriceTableError, match="cannot be read"):
        load_price_table()
