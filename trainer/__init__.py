"""trainer: compact Llama with pluggable HD-RoPE, real offline data, exact-resume training, evals and dumps.

Depends on `hdrope`, never on Ray or `sweeps`. Public entry point: `trainer.train(cfg, reporter)`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config import RunConfig
    from trainer.presets import load_config
    from trainer.run.loop import TrainResult, train
    from trainer.run.reporting import Reporter

# Public names -> the submodule defining them, imported on first use (PEP 562) so that `import trainer.config`
# stays light. A test imports and calls each one.
_EXPORTS = {
    "train": "trainer.run.loop",
    "TrainResult": "trainer.run.loop",
    "RunConfig": "trainer.config",
    "load_config": "trainer.presets",
    "Reporter": "trainer.run.reporting",
}

__all__ = ["Reporter", "RunConfig", "TrainResult", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
