"""trainer: compact Llama with pluggable HD-RoPE, real offline data, exact-resume training, evals and dumps.

Depends on `hdrope`, never on Ray or `sweeps`. Public entry point: `trainer.train(cfg, reporter)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hdrope.moved import lazy_exports, register

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

# Modules that moved when the package was split into data/model/run/evals/export/files: importing an old name
# fails with a message naming the new home (hdrope.moved).
register({f"trainer.{old}": f"trainer.{new}" for old, new in {
    "attention_dump": "evals.attention_dump", "batches": "data.batches", "bench": "run.bench",
    "cache": "files.cache", "checkpoint": "run.checkpoint", "cli": "run.cli", "corpus": "data.corpus",
    "data_cli": "data.cli", "dir_lock": "files.dir_lock", "distributed": "run.distributed",
    "encodings": "model.encodings", "encodings_bench": "model.bench", "eval_cli": "evals.cli",
    "evaluate": "evals.evaluate", "generate": "model.generate", "hf_compat": "export.hf_compat",
    "hf_export": "export.hf_export", "lm_harness": "evals.lm_harness", "loop": "run.loop", "optim": "run.optim",
    "passkey": "evals.passkey", "position": "model.position", "reporting": "run.reporting",
    "run_files": "files.run_files", "shard_manifest": "data.shard_manifest", "shard_prepare": "data.shard_prepare",
    "shard_tokens": "data.shard_tokens", "throughput": "model.throughput", "token_cache": "data.token_cache",
    "tokenizer": "data.tokenizer", "trained": "run.trained", "model.encodings.learned": "model.encodings.learned_basis",
}.items()})


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
