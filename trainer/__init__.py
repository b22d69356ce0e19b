"""trainer: compact Llama with pluggable HD-RoPE, real offline data, exact-resume training, evals and dumps.

Depends on `hdrope`, never on Ray or `sweeps`. Public entry point: `trainer.train(cfg, reporter)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Reporter", "RunConfig", "TrainResult", "load_config", "train"]

if TYPE_CHECKING:
    from trainer.config import RunConfig
    from trainer.run.loop import TrainResult
    from trainer.run.reporting import Reporter


def __getattr__(name: str) -> Any:  # lazy, so `import trainer.config` stays light
    if name in ("train", "TrainResult"):
        from trainer import loop

        return getattr(loop, name)
    if name == "RunConfig":
        from trainer.config import RunConfig

        return RunConfig
    if name == "load_config":
        from trainer.presets import load_config

        return load_config
    if name == "Reporter":
        from trainer.run.reporting import Reporter

        return Reporter
    raise AttributeError(name)
