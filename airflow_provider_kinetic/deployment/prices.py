"""``[kinetic] price_table``: the deployment's own prices, for estimated costs.

Usage is measured in chip-hours (``core.jobs.usage``); a cost is shown only where the
deployment says what a chip-hour costs it (list prices change, discounts differ), so
without a table nothing anywhere has a cost field, and a job the table does not price
is named as unpriced, never given a price.

The table is a CSV file (a spreadsheet exports it; ``#`` starts a comment line)::

    accelerator,capacity,usd_per_chip_hour
    tpu-v6e,on-demand,2.70
    v6e,spot,1.10
    tpu-v5e,reservation:my-res,1.20
    gpu-h100,*,9.80

- ``accelerator``: a catalog family, with or without its kind (``tpu-v6e`` or ``v6e``,
  ``gpu-h100`` or ``h100``; aliases too: ``v5e`` is ``v5litepod``,
  ``nvidia-h100-80gb`` is ``h100``); any slice size of the family. CPUs have no chips
  and are not priced.
- ``capacity``: a capacity kind (``on-demand``, ``spot``, ``flex-start``,
  ``reservation``, ``queue``, ``class``), one named step (``reservation:my-res``: it
  wins over its kind's row), or ``*`` (any capacity without its own row).
- ``usd_per_chip_hour``: a number, 0 or more.

A bad file fails with an error naming the file and its bad row.
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

from airflow.providers.common.compat.sdk import conf

from airflow_provider_kinetic.core.catalog.capacity import CAPACITY_KINDS
from airflow_provider_kinetic.core.catalog.hardware import (
    GPU_ALIASES,
    GPU_TYPES,
    TPU_ALIASES,
    TPU_TYPES,
)
from airflow_provider_kinetic.core.errors import KineticError

log = logging.getLogger(__name__)

COLUMNS = ("accelerator", "capacity", "usd_per_chip_hour")
ANY_CAPACITY = "*"


class PriceTableError(KineticError, ValueError):
    """A price table that cannot be read as given (the message names file and row)."""


def family(name: str) -> str | None:
    """``tpu-v6e`` / ``v6e`` / ``gpu-h100`` / ``h100`` (and catalog aliases) -> the
    family key usage is priced by (``tpu-v6e``, ``gpu-h100``); None: no such family."""
    text = name.strip().lower()
    kind, _, rest = text.partition("-")
    kinds = ("tpu", "gpu") if kind not in ("tpu", "gpu") or not rest else (kind,)
    body = rest if len(kinds) == 1 else text
    for k in kinds:
        names, aliases = (TPU_TYPES, TPU_ALIASES) if k == "tpu" else (GPU_TYPES, GPU_ALIASES)
        found = body if body in names else aliases.get(body)
        if found in names:
            return f"{k}-{found}"
    return None


def _capacity(text: str) -> str | None:
    value = text.strip()
    kind, sep, name = value.partition(":")
    if value == ANY_CAPACITY or (kind in CAPACITY_KINDS and (not sep or name.strip())):
        return value
    return None


def parse_price_table(text: str, source: str) -> dict[str, dict[str, float]]:
    """The table in ``text`` (from ``source``, named in errors) as ``{family: {capacity:
    USD per chip-hour}}``, the form ``core.jobs.usage`` prices with."""
    rows = [
        (number, next(csv.reader([line])))
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows or [c.strip().lower() for c in rows[0][1]] != list(COLUMNS):
        raise PriceTableError(
            f"price table {source}: the first row must be the header {','.join(COLUMNS)}"
            + (f", got {','.join(rows[0][1])!r}" if rows else " (the file has no rows)")
        )
    table: dict[str, dict[str, float]] = {}
    for number, row in rows[1:]:
        where = f"price table {source}, line {number} ({','.join(row)!r})"
        if len(row) != len(COLUMNS):
            raise PriceTableError(f"{where}: expected {len(COLUMNS)} columns: {','.join(COLUMNS)}")
        accel, capacity, price = row
        key = family(accel)
        if key is None:
            raise PriceTableError(
                f"{where}: unknown accelerator {accel.strip()!r}: expected a TPU or GPU family "
                f"of the catalog (tpu-v6e or v6e, gpu-h100 or h100; `airflow kinetic "
                f"accelerators` lists them; CPUs have no chips and are not priced)"
            )
        cap = _capacity(capacity)
        if cap is None:
            raise PriceTableError(
                f"{where}: unknown capacity {capacity.strip()!r}: expected one of "
                f"{', '.join(CAPACITY_KINDS)}, KIND:NAME or {ANY_CAPACITY}"
            )
        try:
            usd = float(price)
        except ValueError:
            usd = math.nan
        if not math.isfinite(usd) or usd < 0:
            raise PriceTableError(f"{where}: {price.strip()!r} is not a price (USD, 0 or more)")
        if cap in table.setdefault(key, {}):
            raise PriceTableError(f"{where}: {key} on {cap} is priced twice")
        table[key][cap] = usd
    return table


def read_price_table(path: str | Path) -> dict[str, dict[str, float]]:
    """The price table in the file ``path``."""
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceTableError(f"price table {path}: cannot be read: {exc}") from None
    return parse_price_table(text, str(path))


def load_price_table(*, strict: bool = True) -> dict[str, dict[str, float]] | None:
    """The table ``[kinetic] price_table`` names; None when none is set (then nothing
    shows a cost).  A bad table raises :class:`PriceTableError`, or with
    ``strict=False`` (a task's usage line must not fail the task) is logged as a
    warning and gives None."""
    path = (conf.get("kinetic", "price_table", fallback="") or "").strip()
    if not path:
        return None
    try:
        return read_price_table(path)
    except PriceTableError as exc:
        if strict:
            raise
        log.warning("no estimated cost: %s", exc)
        return None
