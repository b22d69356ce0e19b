"""A trained model back from its run directory: config, weights (checked checkpoint) and tokenizer.

The one loader behind every command that evaluates or exports a checkpoint (`hdrope passkey eval`,
`hdrope eval lm-eval`, `hdrope export`): the run's own config.yaml two levels above the checkpoint says
which model it is, and its tokenizer is the copy the run keeps (run_dir/tokenizer.json), so nothing is
guessed from flags or the current directory. The config must hash to the checkpoint's config hash: a
config.yaml edited after training is refused, not used to build another model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hdrope.errors import UserError
from trainer.config import RunConfig, config_hash
from trainer.data.documents import document_policy
from trainer.data.tokenizer import BUILTIN_TOKENIZERS
from trainer.files.run_files import TOKENIZER_FILE
from trainer.model.llama import Llama
from trainer.model.pe_schedule import model_args_at
from trainer.presets import merge_config, yaml_layer
from trainer.run.checkpoint import load_checkpoint, read_state

__all__ = ["Trained", "load_trained", "run_config", "run_tokenizer"]


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


def run_tokenizer(cfg: RunConfig, run_dir: Path | None = None):
    """The tokenizer a run trained with: the copy in run_dir when the run keeps one, else what data.tokenizer
    gives (a BPE is rebuilt from the run's corpus, cached by content)."""
    from trainer.data.tokenizer import load_tokenizer

    stored = Path(run_dir) / TOKENIZER_FILE if run_dir is not None else None
    if cfg.data.tokenizer != "bytes" and stored is not None and stored.is_file():
        return load_tokenizer(str(stored))
    texts = None
    if cfg.data.tokenizer == "bpe":
        from trainer.data.corpus import load_corpus

        texts = load_corpus(cfg.data).train
    return load_tokenizer(cfg.data.tokenizer, texts, cfg.data.bpe_vocab_size, cfg.data.cache_dir)


def run_config(checkpoint: Path) -> RunConfig:
    """The config of the run a checkpoint belongs to (its config.yaml two levels up, with the run's own copy of
    a tokenizer.json), checked against the config hash the checkpoint was written with."""
    run_dir = Path(checkpoint).parent.parent
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{checkpoint}: no config.yaml two levels up; pass a checkpoint inside a run directory "
                        "(runs/<name>-<hash>/checkpoints/step_N)")
    cfg = merge_config([yaml_layer(cfg_path, "the run's config.yaml is damaged; restore it")], where=str(cfg_path))
    stored = run_dir / TOKENIZER_FILE
    if cfg.data.tokenizer not in BUILTIN_TOKENIZERS and stored.is_file():
        cfg.data.tokenizer = str(stored)  # the run's copy: the path may have moved, changed or be relative
    trained_with, now = read_state(Path(checkpoint)).get("config_hash"), config_hash(cfg)
    if trained_with != now:
        raise UserError(f"{cfg_path}: gives config {now}, but checkpoint {checkpoint} was trained with config "
                        f"{trained_with}: config.yaml (or the run's tokenizer) was changed after training; restore "
                        "the config.yaml the run wrote, or train the edited config")
    return cfg


def load_trained(checkpoint: Path, cfg: RunConfig | None = None, tok: Any = None) -> Trained:
    """The model of `checkpoint` with its weights loaded (checksums verified), in eval mode, and its tokenizer."""
    checkpoint = Path(checkpoint)
    cfg = cfg if cfg is not None else run_config(checkpoint)
    model = Llama(model_args_at(cfg, read_state(checkpoint)["step"]))  # the encoding in force then (a schedule's)
    load_checkpoint(checkpoint, model)
    model.eval()
    tok = tok if tok is not None else run_tokenizer(cfg, checkpoint.parent.parent)
    model.documents = document_policy(cfg.data, tok)  # evaluations see the documents as training did
    return Trained(cfg, model, tok, checkpoint)
