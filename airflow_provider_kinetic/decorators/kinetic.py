"""``@task.kinetic``: the TaskFlow form of KineticRunOperator.

The function is pickled (by value), not shipped as source, so helpers, closures
and module-level imports from the DAG file work remotely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import DecoratedOperator, task_decorator_factory

from airflow_provider_kinetic.operators.run import KineticRunOperator


class KineticDecoratedOperator(DecoratedOperator, KineticRunOperator):
    """Public (subclassable) operator behind ``@task.kinetic``."""

    custom_operator_name = "@task.kinetic"
    template_fields: Sequence[str] = KineticRunOperator.template_fields
    template_fields_renderers = KineticRunOperator.template_fields_renderers
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Any = None,
        op_kwargs: Any = None,
        **kwargs: Any,
    ) -> None:
        # DecoratedOperator consumes these; KineticRunOperator needs them too.
        super().__init__(
            python_callable=python_callable,
            op_args=op_args,
            op_kwargs=op_kwargs,
            kwargs_to_upstream={
                "python_callable": python_callable,
                "op_args": op_args,
                "op_kwargs": op_kwargs,
            },
            **kwargs,
        )


def kinetic_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``@task.kinetic(accelerator="tpu-v5e-4", deferrable=True)`` on a function."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=KineticDecoratedOperator,
        **kwargs,
    )
