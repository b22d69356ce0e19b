"""`hdrope passkey eval`: greedy passkey retrieval of a checkpoint on a built dataset, as a Parquet table.

Decoding is greedy with the trainer's model and KV cache (the same position handling as training).
A line is correct when the first integer generated equals the answer (exact match, also for
multi-token passkeys). The table has one row per (bucket U, relative-depth bin): accuracy, n, and
the rotation config; `target_length`/`depth_target`/`correct` aliases feed the analysis polar fan.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from hdrope.errors import UserError
from trainer.checkpoint import load_checkpoint
from trainer.config import config_hash
from trainer.generate import greedy_generate
from trainer.model import Llama
from trainer.passkey.prompt import first_integer, stop_after_number
from trainer.position import encoding_identity
from trainer.presets import merge_config

__all__ = ["evaluate_dataset"]

_NAME = re.compile(r"^x(\d+)_y(\d+)_xt\d+_yt\d+_T(\d+)\.jsonl$")


def _model_tokenizer(cfg):
    from trainer.tokenizer import load_tokenizer

    texts = None
    if cfg.data.tokenizer == "bpe":
        from trainer.corpus import load_corpus

        texts = load_corpus(cfg.data).train
    return load_tokenizer(cfg.data.tokenizer, texts, cfg.data.bpe_vocab_size, cfg.data.cache_dir)


def evaluate_dataset(checkpoint: Path, dataset: Path, out: Path | None = None, max_lines_per_file: int = 0,
                     tracking_uri: str = "", progress: bool = True) -> Path:
    """Score every (or the first N per file) line; write and return the Parquet table."""
    meta_path = dataset / "dataset_meta.json"
    if not meta_path.is_file():
        raise UserError(f"{dataset}: no dataset_meta.json; build it with `hdrope passkey build`")
    meta = json.loads(meta_path.read_text())
    cfg_path = checkpoint.parent.parent / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{checkpoint}: no config.yaml two levels up; pass a checkpoint inside a run directory")
    cfg = merge_config([OmegaConf.load(cfg_path)], where=str(cfg_path))
    tok = _model_tokenizer(cfg)
    if tok.identity != meta["tokenizer"]:
        raise UserError(f"{dataset} was built with tokenizer {meta['tokenizer']} but the model uses {tok.identity}; "
                         "rebuild the dataset with the model's tokenizer")
    model = Llama(cfg.model)
    load_checkpoint(checkpoint, model)
    model.eval()
    files = sorted(f for f in dataset.glob("*/*.jsonl") if _NAME.match(f.name))
    if not files:
        raise UserError(f"{dataset}: no JSONL files (was it a --dry-run?)")
    stop = stop_after_number(tok)
    rows = []
    from tqdm import tqdm

    for f in tqdm(files, disable=not progress, unit="file"):
        x, y, t = map(int, _NAME.match(f.name).groups())
        lines = f.read_text().splitlines()
        for line in lines[: max_lines_per_file or None]:
            item = json.loads(line)
            ids = tok.encode(item["question"])
            with torch.no_grad():
                gen = greedy_generate(model, ids, len(tok.encode(" " + item["answer"])) + 3, stop)
            rows.append({"bucket_u": int(f.parent.name), "x": x, "y": y, "tokens": t, "depth": x / (x + y),
                         "correct": first_integer(tok.decode(gen)) == item["answer"]})
    raw = pd.DataFrame(rows)
    raw["depth_bin"] = (raw["depth"] * 10).clip(upper=9.999).astype(int) / 10 + 0.05
    table = raw.groupby(["bucket_u", "depth_bin"], as_index=False).agg(accuracy=("correct", "mean"),
                                                                       n=("correct", "size"))
    chash = config_hash(cfg)
    table = table.assign(**encoding_identity(cfg.model.pe), config_hash=chash, checkpoint=str(checkpoint),
                         target_length=table["bucket_u"], depth_target=table["depth_bin"], correct=table["accuracy"])
    out = out or dataset / f"eval_{chash}.parquet"
    table.to_parquet(out, index=False)
    if tracking_uri:
        import mlflow

        client = mlflow.MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name("hdrope-passkey")
        exp_id = exp.experiment_id if exp else client.create_experiment("hdrope-passkey")
        run = client.create_run(exp_id, run_name=f"{cfg.name}-{chash}", tags={"config_hash": chash})
        for u, g in raw.groupby("bucket_u"):
            client.log_metric(run.info.run_id, f"passkey_acc_U{u}", float(g["correct"].mean()))
        client.log_metric(run.info.run_id, "passkey_acc", float(raw["correct"].mean()))
        client.set_terminated(run.info.run_id)
    return out
