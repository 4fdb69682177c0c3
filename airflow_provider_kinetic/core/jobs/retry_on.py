"""``retry_on=``: how many re-submits each failure class gets within one Airflow try.

Forms (checked when the operator is made, i.e. at DAG parse time, and again once
rendered):

* ``{"preemption": 3, "infra": 1, "user_error": 0, "no_capacity": 0}``: re-submits
  per class (classes left out get none, except ``preemption``: ``preemption_retries``);
* ``{"exit_codes": [42, 143]}`` (alone or beside counts): failures with these exit
  codes count as ``infra``;
* ``"never"``: never re-submit anything (a function that must not run twice); the
  task fails with the class and phase.  A capacity fallback still moves on (its
  function never started).

``timeout``, ``cancelled`` and ``store`` are never re-submitted: the try is out of
time, someone stopped the job on purpose, or the function ran and only its result
was not read (a re-submit would run it twice; the next try collects it).
``preemption_retries=N`` is a spelling of ``{"preemption": N}``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_kinetic.core.errors import KineticError
from airflow_provider_kinetic.core.spec.failure import FailureClass

#: Classes a re-submit can help.
RETRYABLE = (
    FailureClass.PREEMPTION,
    FailureClass.INFRA,
    FailureClass.USER_ERROR,
    FailureClass.NO_CAPACITY,
)
NEVER = "never"
EXIT_CODES = "exit_codes"
#: ``preemption_retries``' default.
DEFAULT_PREEMPTION_RETRIES = 2
#: A batch input's preemption re-submits when ``input_retries`` does not name them.
BATCH_PREEMPTION_RETRIES = 3
ALLOWED = (
    f"a dict of re-submit counts per class ({', '.join(c.value for c in RETRYABLE)}: "
    f'non-negative ints) and/or "{EXIT_CODES}": a list of exit codes (0-255) that count as '
    f'infra, e.g. {{"preemption": 3, "infra": 1, "user_error": 0}}; or the string "{NEVER}"'
)


class BadRetryOn(KineticError, ValueError):
    """A ``retry_on`` (or ``input_retries``) that is none of the allowed forms."""


@dataclass(frozen=True)
class RetryOn:
    """Re-submits per failure class, and the exit codes that count as infra."""

    counts: Mapping[str, int] = field(default_factory=dict)
    exit_codes: frozenset[int] = frozenset()
    never: bool = False

    def budget(self, failure_class: FailureClass | str) -> int:
        """How many re-submits a failure of ``failure_class`` gets (0 under "never")."""
        if self.never:
            return 0
        return int(self.counts.get(FailureClass(failure_class).value, 0))

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> RetryOn:
        """The form :meth:`to_dict` wrote (a batch's state carries it)."""
        if value.get(NEVER):
            return cls(never=True)
        counts = {k: int(v) for k, v in value.items() if k != EXIT_CODES}
        return cls(counts, frozenset(value.get(EXIT_CODES) or ()))

    def to_dict(self) -> dict[str, Any]:
        if self.never:
            return {NEVER: True}
        out: dict[str, Any] = dict(self.counts)
        if self.exit_codes:
            out[EXIT_CODES] = sorted(self.exit_codes)
        return out


def is_template(value: Any) -> bool:
    """A string Airflow has not rendered yet (checked once rendered instead)."""
    return isinstance(value, str) and "{{" in value


def parse_retry_on(
    value: Any,
    *,
    preemption_retries: int | None = None,
    what: str = "retry_on",
    default_preemptions: int = DEFAULT_PREEMPTION_RETRIES,
) -> RetryOn:
    """``value`` (a ``retry_on``) as a :class:`RetryOn`; ``preemption_retries``: the
    operator's own spelling of ``{"preemption": N}`` (None: not given);
    ``default_preemptions``: preemption re-submits when neither names them.

    Raises:
        BadRetryOn: naming the bad value and the allowed forms.
    """
    if preemption_retries is not None and (
        isinstance(preemption_retries, bool)
        or not isinstance(preemption_retries, int)
        or preemption_retries < 0
    ):
        raise BadRetryOn(
            f"preemption_retries must be a non-negative int, got {preemption_retries!r}"
        )
    if isinstance(value, str) and value.strip() != NEVER:
        value = _literal(value, what)
    if value is None:
        n = default_preemptions if preemption_retries is None else preemption_retries
        return RetryOn({FailureClass.PREEMPTION.value: n})
    if isinstance(value, str):  # "never"
        if preemption_retries:
            raise BadRetryOn(
                f'{what}="never" cannot be combined with preemption_retries={preemption_retries}'
                f"; allowed: {ALLOWED}"
            )
        return RetryOn(never=True)
    if not isinstance(value, Mapping):
        raise BadRetryOn(f"{what}: got {value!r}; allowed: {ALLOWED}")
    counts: dict[str, int] = {}
    codes: frozenset[int] = frozenset()
    for key, count in value.items():
        if key == NEVER:
            raise BadRetryOn(
                f'{what}: "never" cannot be combined with counts ({value!r}); allowed: {ALLOWED}'
            )
        if key == EXIT_CODES:
            codes = _exit_codes(count, what)
            continue
        if key not in {c.value for c in RETRYABLE}:
            raise BadRetryOn(f"{what}: unknown failure class {key!r}; allowed: {ALLOWED}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise BadRetryOn(
                f"{what}[{key!r}] must be a non-negative int, got {count!r}; allowed: {ALLOWED}"
            )
        counts[key] = count
    preempt = FailureClass.PREEMPTION.value
    if preemption_retries is not None:
        if preempt in counts and counts[preempt] != preemption_retries:
            raise BadRetryOn(
                f"{what}[{preempt!r}]={counts[preempt]} and preemption_retries="
                f"{preemption_retries} disagree: give one"
            )
        counts[preempt] = preemption_retries
    counts.setdefault(preempt, default_preemptions)
    return RetryOn(counts, codes)


def _literal(text: str, what: str) -> Any:
    """A rendered template: JSON or the Python literal Jinja makes of a dict."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise BadRetryOn(f"{what}: got {text!r}; allowed: {ALLOWED}") from None


def _exit_codes(value: Any, what: str) -> frozenset[int]:
    if not isinstance(value, list | tuple | set | frozenset) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in value
    ):
        raise BadRetryOn(
            f"{what}[{EXIT_CODES!r}] must be a list of exit codes 0-255, got {value!r}; "
            f"allowed: {ALLOWED}"
        )
    return frozenset(value)


def input_policy(value: Any) -> RetryOn | None:
    """A map's ``input_retries``: None for a count (any failure, as before), else its
    per-class form, per input (preemptions: ``BATCH_PREEMPTION_RETRIES`` unless named)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return parse_retry_on(value, what="input_retries", default_preemptions=BATCH_PREEMPTION_RETRIES)
