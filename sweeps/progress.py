"""What a running sweep prints: one line per trial event, with the step of total and an ETA per trial.

Tune's own console output (configuration boxes, per-trial result tables, a TensorBoard hint for a
logger we do not use) is turned off (`verbose=0` with Tune's classic output, `RAY_AIR_NEW_OUTPUT=0`,
set by the runner); this callback prints instead, on the driver:

    [03:36:12] 4D-Paley-θ10000-s42   step    60/120   eta   35 s  train_loss 2.401   (2 running, 4 pending)
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, TextIO

from ray import tune

__all__ = ["ProgressCallback", "quiet_logs"]

SHOWN = ("train_loss", "val_loss", "passkey_acc")  # the metrics a progress line carries when a result has them


class _DropNotice(logging.Filter):
    """Drops the log records whose message starts with `prefix`."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


# Ray warns on every start that token auth is on: the lab keeps it on by design, so it says nothing to a researcher
_TOKEN_NOTICE = ("ray._private.authentication.authentication_token_setup",
                 "Token authentication is enabled for this Ray cluster")


def quiet_logs() -> None:
    """Silence chatter that says nothing to a researcher (MLflow's schema set-up, Ray Train's checkpoint lines, Ray's
    notice that token auth is on)."""
    for name in ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    token_log = logging.getLogger(_TOKEN_NOTICE[0])
    if not any(isinstance(f, _DropNotice) for f in token_log.filters):
        token_log.addFilter(_DropNotice(_TOKEN_NOTICE[1]))


def _eta(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or math.isnan(seconds):
        return "eta    -"
    return f"eta {seconds:4.0f} s" if seconds < 120 else f"eta {seconds / 60:4.1f} min"


class ProgressCallback(tune.Callback):
    """Prints a line when a trial starts, reports (at most every `every_s` seconds per trial), ends or fails."""

    def __init__(self, every_s: float = 10.0, out: TextIO | None = None) -> None:
        self.every_s, self.out = every_s, out
        self._last: dict[str, float] = {}
        self._width = 20

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks with the experiment state
        return {"every_s": self.every_s, "out": None, "_last": {}, "_width": 20}

    def _print(self, trials: list[Any], text: str, trial: Any = None, status: str | None = None) -> None:
        """Print text with the trials' counts by status; `trial` counted as `status`, the state its event moves it
        to (Tune calls on_trial_start before the trial is RUNNING and on_trial_complete before it is TERMINATED)."""
        counts: dict[str, int] = {}
        for t in trials:
            now = status if t is trial and status else t.status
            counts[now] = counts.get(now, 0) + 1
        state = ", ".join(f"{counts[k]} {label}" for k, label in
                          (("RUNNING", "running"), ("PENDING", "pending"), ("TERMINATED", "done"), ("ERROR", "failed"))
                          if counts.get(k))
        print(f"[{time.strftime('%H:%M:%S')}] {text}   ({state})", file=self.out or sys.stderr, flush=True)

    def _name(self, trial: Any) -> str:
        self._width = max(self._width, len(str(trial)))
        return f"{trial!s:<{self._width}}"

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(trials, f"{self._name(trial)} started", trial, "RUNNING")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        now = time.monotonic()
        if "step" not in result or now - self._last.get(trial.trial_id, -math.inf) < self.every_s:
            return
        self._last[trial.trial_id] = now
        self._print(trials, f"{self._name(trial)} {self._step(result)}")

    @staticmethod
    def _step(result: dict) -> str:
        steps = result.get("steps") or "?"
        shown = "  ".join(f"{k} {result[k]:.4g}" for k in SHOWN if isinstance(result.get(k), (int, float)))
        return f"step {int(result['step']):>5}/{steps:<5} {_eta(result.get('eta_s'))}  {shown}".rstrip()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        done = self._step(result) if "step" in result else ""
        self._print(trials, f"{self._name(trial)} finished {done}".rstrip(), trial, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(trials, f"{self._name(trial)} FAILED (see `hdrope sweep logs`; error in {trial.error_file})",
                    trial, "ERROR")
