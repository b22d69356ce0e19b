"""A trained model back from its run directory: config, weights (checked checkpoint) and tokenizer.

The one loader behind every command that evaluates a checkpoint (`hdrope passkey eval`,
`hdrope eval lm-eval`): the run's own config.yaml two levels above the checkpoint says which
model and tokenizer it is, so nothing is guessed from flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hdrope.errors import UserError
from trainer.checkpoint import load_checkpoint
from trainer.config import RunConfig, config_hash
from trainer.model import Llama
from trainer.presets import merge_config

__all__ = ["Trained", "load_trained", "run_tokenizer"]


@dataclass
class Trained:
    """A run's config, its model with the checkpoint's weights (eval mode) and its tokenizer."""

    cfg: RunConfig
    model: Llama
    tok: Any
    checkpoint: Path

    @property
    def run_dir(self) -> Path:
        return self.checkpoint.parent.parent

    @property
    def config_hash(self) -> str:
        return config_hash(self.cfg)


def run_tokenizer(cfg: RunConfig):
    """The tokenizer a run trained with (a BPE is rebuilt from the run's corpus, cached by content)."""
    from trainer.tokenizer import load_tokenizer

    texts = None
    if cfg.data.tokenizer == "bpe":
        from trainer.corpus import load_corpus

        texts = load_corpus(cfg.data).train
    return load_tokenizer(cfg.data.tokenizer, texts, cfg.data.bpe_vocab_size, cfg.data.cache_dir)


def run_config(checkpoint: Path) -> RunConfig:
    """The config of the run a checkpoint belongs to (its config.yaml two levels up)."""
    cfg_path = Path(checkpoint).parent.parent / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{checkpoint}: no config.yaml two levels up; pass a checkpoint inside a run directory "
                        "(runs/<name>-<hash>/checkpoints/step_N)")
    return merge_config([OmegaConf.load(cfg_path)], where=str(cfg_path))


def load_trained(checkpoint: Path, cfg: RunConfig | None = None, tok: Any = None) -> Trained:
    """The model of `checkpoint` with its weights loaded (checksums verified), in eval mode, and its tokenizer."""
    checkpoint = Path(checkpoint)
    cfg = cfg if cfg is not None else run_config(checkpoint)
    model = Llama(cfg.model)
    load_checkpoint(checkpoint, model)
    model.eval()
    return Trained(cfg, model, tok if tok is not None else run_tokenizer(cfg), checkpoint)
