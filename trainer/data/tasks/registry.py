"""The task registry: every task name the config accepts, mapped to its `TaskSpec`."""

from __future__ import annotations

from trainer.data.tasks import needles, sequence, state
from trainer.data.tasks.spec import TaskSpec

__all__ = ["TASKS"]

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (*sequence.SPECS, *needles.SPECS, *state.SPECS)}
