"""What the embedded Ray's workers do not say: Ray Train v2's placement-group cleaner polls the State API, which an
embedded Ray started without its dashboard does not serve, and logs "Failed to query Ray Train Controller actor
state" once a second for as long as a multi-worker trial runs. Every worker of the embedded Ray runs
`quiet_train_cleaner` as its setup hook (`sweeps.runner`), which silences that one logger below errors; a cluster
keeps its dashboard, and its own logging."""

from __future__ import annotations

import logging

__all__ = ["CLEANER_LOGGER", "quiet_train_cleaner"]

CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def quiet_train_cleaner() -> None:
    """Raise the placement-group cleaner's logger to errors in this worker process."""
    logging.getLogger(CLEANER_LOGGER).setLevel(logging.ERROR)
