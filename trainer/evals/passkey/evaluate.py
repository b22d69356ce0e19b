"""`hdrope passkey eval`: greedy passkey retrieval of a checkpoint on a built dataset, as a Parquet table.

Decoding is greedy with the trainer's model and KV cache (the same position handling as training).
A line is correct when the first integer generated equals the answer (exact match, also for
multi-token passkeys). The table is the one passkey table (`trainer.evals.passkey.table`): a row per
line, target_length the bucket's upper edge U and depth the key's by `key_depth` (from the file's xt, yt).
The arguments, dataset_meta.json and every JSONL line are checked before the model is loaded, so a
bad line is reported by file and line number up front, not after hours of decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from hdrope.errors import UserError
from trainer.config import config_hash
from trainer.data.passkey_prompt import first_integer, key_depth, stop_after_number
from trainer.evals.passkey.builder import FILE_NAME
from trainer.evals.passkey.table import write_passkey_table
from trainer.model.generate import greedy_generate
from trainer.run.trained import load_trained, run_config, run_tokenizer

__all__ = ["evaluate_dataset"]

_REBUILD = "rebuild the dataset with `hdrope passkey build`"


def _check_args(out: Path | None, max_lines_per_file: int) -> None:
    """UserError naming --out or --max-lines-per-file when the Parquet table could not be written or read."""
    if max_lines_per_file < 0:
        raise UserError(f"--max-lines-per-file {max_lines_per_file}: must be >= 0 (0: every line)")
    if out is None:
        return
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file path such as {out / 'eval.parquet'}")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: directory {out.parent} does not exist; create it first or pick a path in an "
                        "existing directory")


def _read_meta(dataset: Path) -> dict[str, Any]:
    """The dataset's dataset_meta.json; UserError naming the file if it is missing or not the builder's."""
    path = dataset / "dataset_meta.json"
    if not path.is_file():
        raise UserError(f"{dataset}: no dataset_meta.json; build it with `hdrope passkey build`")
    try:
        meta = json.loads(path.read_text())
    except ValueError as err:  # JSONDecodeError or UnicodeDecodeError: the user's file is not JSON text
        raise UserError(f"{path}: not valid JSON ({err}); {_REBUILD}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("tokenizer"), str):
        raise UserError(f"{path}: no 'tokenizer' string in {str(meta)[:60]!r}; {_REBUILD}")
    return meta


def _parse_line(path: Path, number: int, line: str) -> dict[str, str]:
    """One JSONL line as {"question", "answer"}; UserError naming file, line and value otherwise."""
    fix = f"fix or delete that line, or {_REBUILD}"
    try:
        item = json.loads(line)
    except ValueError as err:  # JSONDecodeError, or json's ValueError for a >4300-digit number: the line is not JSON
        raise UserError(f"{path}:{number}: not JSON ({err}): {line[:60]!r}; {fix}") from None
    for key in ("question", "answer"):
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            raise UserError(f"{path}:{number}: no {key!r} string in {line[:60]!r}; each line must be "
                            f'{{"question": "...", "answer": "..."}}; {fix}')
    if not item["answer"].isdigit():
        raise UserError(f"{path}:{number}: answer {item['answer'][:20]!r} is not a passkey (digits); {fix}")
    return item


def _read_items(path: Path, max_lines: int) -> list[dict[str, str]]:
    """The first max_lines (0: all) lines of one JSONL file, checked."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); {_REBUILD}") from None
    return [_parse_line(path, n, line) for n, line in enumerate(text.splitlines()[: max_lines or None], 1)]


def _dataset_files(dataset: Path, max_lines: int) -> list[Path]:
    """The builder's JSONL files under the bucket directories, every line checked; UserError if there are none, or
    if a directory holding JSONL files is not named by a bucket's length (its prompts would be skipped unscored)."""
    for d in sorted(p for p in dataset.iterdir() if p.is_dir() and not p.name.isdigit()):
        if any(d.glob("*.jsonl")):
            raise UserError(f"{d}: holds JSONL files but is no bucket directory: a bucket is named by its target "
                            f"length in tokens, a whole number such as 1024, and {d.name!r} is not; rename it to its "
                            "bucket's length or move it out of the dataset")
    files = sorted(f for f in dataset.glob("*/*.jsonl") if f.parent.name.isdigit() and FILE_NAME.match(f.name))
    if not files:
        raise UserError(f"{dataset}: no JSONL files (was it a --dry-run?)")
    if not sum(len(_read_items(f, max_lines)) for f in files):
        raise UserError(f"{dataset}: its JSONL files hold no lines; {_REBUILD}")
    return files


def evaluate_dataset(checkpoint: Path, dataset: Path, out: Path | None = None, max_lines_per_file: int = 0,
                     tracking_uri: str = "", progress: bool = True) -> Path:
    """Score every (or the first N per file) line; write and return the Parquet table."""
    _check_args(out, max_lines_per_file)
    meta = _read_meta(dataset)
    cfg = run_config(checkpoint)
    tok = run_tokenizer(cfg, Path(checkpoint).parent.parent)
    if tok.identity != meta["tokenizer"]:
        raise UserError(f"{dataset} was built with tokenizer {meta['tokenizer']} but the model uses {tok.identity}; "
                         "rebuild the dataset with the model's tokenizer")
    files = _dataset_files(dataset, max_lines_per_file)
    model = load_trained(checkpoint, cfg, tok).model
    stop = stop_after_number(tok)
    rows = []
    from tqdm import tqdm

    for f in tqdm(files, disable=not progress, unit="file"):
        name = FILE_NAME.match(f.name)
        bucket, depth = int(f.parent.name), key_depth(int(name["xt"]), int(name["yt"]))
        for sample, item in enumerate(_read_items(f, max_lines_per_file)):
            ids = tok.encode(item["question"])
            with torch.no_grad():
                gen = greedy_generate(model, ids, len(tok.encode(" " + item["answer"])) + 3, stop)
            text = tok.decode(gen)
            rows.append({"length": len(ids), "target_length": bucket, "length_factor": bucket / cfg.model.max_seq_len,
                         "depth": depth, "depth_target": depth, "sample": sample, "passkey": int(item["answer"]),
                         "generated": text, "correct": first_integer(text) == item["answer"]})
    chash = config_hash(cfg)
    out = write_passkey_table(rows, cfg, chash, out or dataset / f"eval_{chash}.parquet")
    raw = pd.DataFrame(rows)
    if tracking_uri:  # onto the trained model's runs (by config hash), as `hdrope eval lm-eval` does
        from trainer.run.tracking import log_eval_metrics

        metrics = {f"passkey_acc_U{u}": float(g["correct"].mean()) for u, g in raw.groupby("target_length")}
        log_eval_metrics(tracking_uri, cfg, {**metrics, "passkey_acc": float(raw["correct"].mean())},
                         int(cfg.train.steps), "hdrope-passkey")
    return out
