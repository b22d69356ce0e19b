"""The files of one run directory, and which configuration owns it.

    run.json        {"config_hash", "name", "machine", "machines"}: written when a run starts or resumes; a directory
                    belongs to one configuration. "machine" is this start's (`trainer.files.machine.machine_info`:
                    CPU model, torch's CPU capability, GPU, torch version, threads), "machines" every distinct one
                    that has trained into the directory, in order (a resume elsewhere adds one)
    metrics.jsonl   one JSON object per report, {"step": s, metric: value, ...}; each metric at most once per step
    result.json     the final result (config hash, step, stop reason, every final metric, data-parallel workers)
    lm_eval.json    downstream benchmark results of `hdrope eval lm-eval` (flat lm_<task>_<metric> under "metrics")
    tokenizer.json  the run's tokenizer (a tokenizer.json path or a trained BPE), copied when the run starts: resume
                    checks it, export and evaluation read it, so one run has one tokenizer wherever it is used
    .hdrope.lock    held by the one process training into the directory (`trainer.files.dir_lock`)
    error.txt       what ended a sweep trial that failed (`sweeps.trainable`), left for its next attempt

A directory without run.json that holds anything else is not a run's: `hdrope train` refuses it
(`refuse_foreign_run_dir`), since its files may be the user's own.

A resumed run cuts metrics.jsonl back to the step it resumes from, so the file always equals the
one an uninterrupted run writes. Readers tolerate a last line that is still being written.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from hdrope.errors import UserError
from trainer.files.cache import sha256_file
from trainer.files.dir_lock import LOCK_FILE
from trainer.files.foreign import refuse_foreign

__all__ = [
    "ERROR_FILE",
    "LM_EVAL_FILE",
    "METRICS_FILE",
    "RESULT_FILE",
    "RUN_FILE",
    "TOKENIZER_FILE",
    "append_metrics",
    "claim_run_dir",
    "default_out_dir",
    "metrics_at",
    "read_lm_eval",
    "read_machines",
    "read_metrics",
    "read_result",
    "refuse_foreign_run_dir",
    "store_tokenizer",
    "truncate_metrics",
    "write_json_atomic",
]

RUN_FILE, METRICS_FILE, RESULT_FILE, LM_EVAL_FILE = "run.json", "metrics.jsonl", "result.json", "lm_eval.json"
TOKENIZER_FILE, ERROR_FILE = "tokenizer.json", "error.txt"
_OURS_BEFORE_CLAIM = (LOCK_FILE, f".{RUN_FILE}.tmp", ERROR_FILE)  # what a run directory holds before its run.json


def default_out_dir(name: str, config_hash: str) -> Path:
    """runs/<name>-<config hash>: unique per configuration, so two different runs never share a directory."""
    return Path("runs") / f"{name}-{config_hash}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to path through a temporary file and a rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: {what} is corrupt ({type(err).__name__}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: {what} is not a JSON object; {fix}")
    return data


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result.json, or None when it has none; UserError naming the file when it is corrupt."""
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        return None
    fix = "delete it and resume the run (`hdrope sweep resume` or `hdrope train`)"
    result = _read_json(path, "result.json", fix)
    if (problem := _result_problem(result)) is not None:
        raise UserError(f"{path}: result.json is corrupt ({problem}); {fix}")
    return result


def _result_problem(result: dict[str, Any]) -> str | None:
    """What makes a parsed result.json not one the trainer wrote, or None."""
    if not isinstance(result.get("config_hash"), str) or not result["config_hash"]:
        return f"config_hash is {result.get('config_hash')!r}, not a config hash"
    step = result.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step is {step!r}, not a step count"
    metrics = result.get("metrics")
    if not isinstance(metrics, dict):
        return f"metrics is {type(metrics).__name__}, not a mapping of metric names to numbers"
    bad = {k: v for k, v in metrics.items()
           if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v))}
    if bad:
        name, value = next(iter(bad.items()))
        return f"metric {name} is {value!r}, not a finite number or null"
    return None


def read_lm_eval(run_dir: Path) -> dict[str, float]:
    """The flat lm_eval metrics of a run ({} when it was not evaluated); UserError naming a corrupt file."""
    path = Path(run_dir) / LM_EVAL_FILE
    if not path.is_file():
        return {}
    data = _read_json(path, "lm_eval.json", "delete it and run `hdrope eval lm-eval` again")
    metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def refuse_foreign_run_dir(run_dir: Path) -> None:
    """UserError when run_dir holds no run.json but other files (not a run directory: they may be the user's own,
    which a run would replace); a new, empty or started run directory passes."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_FILE).is_file():
        return
    refuse_foreign(run_dir, f"train.out_dir={str(run_dir)!r}", "hdrope train", lambda p: p.name in _OURS_BEFORE_CLAIM,
                   f" (the directory holds no {RUN_FILE}, so it is no run's)", "pass a new or empty train.out_dir "
                   "(or leave it empty for runs/<name>-<config hash>), or move those files away")


def claim_run_dir(run_dir: Path, config_hash: str, name: str, machine: dict[str, Any] | None = None,
                  facts: dict[str, Any] | None = None) -> None:
    """Make run_dir this configuration's, recording the machine that trains it and `facts` about how it runs (the
    attention path at each length, the documents); UserError when it already holds a run of another
    configuration."""
    run_dir = Path(run_dir)
    owners: dict[str, str] = {}
    before: dict[str, Any] = {}
    if (run_dir / RUN_FILE).is_file():
        before = _read_json(run_dir / RUN_FILE, "run.json", "delete the run directory")
        owners[RUN_FILE] = str(before.get("config_hash", ""))
    result = read_result(run_dir)
    if result is not None:
        owners[RESULT_FILE] = str(result.get("config_hash", ""))
    for where, owner in owners.items():
        if owner != config_hash:
            raise UserError(
                f"train.out_dir={str(run_dir)!r} holds a run of config {owner or '(unknown)'} ({where}), "
                f"not of this config {config_hash}; a run directory belongs to one configuration: pass another "
                "train.out_dir (or leave it empty for runs/<name>-<config hash>), or delete that directory"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    machines = [m for m in before.get("machines", []) if isinstance(m, dict)]
    machines += [machine] if machine is not None and machine not in machines else []
    write_json_atomic(run_dir / RUN_FILE, {"config_hash": config_hash, "name": name, "machine": machine,
                                           "machines": machines, **(facts or {})})


def read_machines(run_dir: Path) -> list[dict[str, Any]]:
    """The machines that trained the run, in order, as its run.json records them ([] when none is recorded);
    UserError naming the file and field when a record's value is not of its type (`MACHINE_COLUMNS`)."""
    from trainer.files.machine import MACHINE_COLUMNS

    path = Path(run_dir) / RUN_FILE
    if not path.is_file():
        return []
    machines = _read_json(path, "run.json", "delete the run directory").get("machines")
    found = [m for m in machines if isinstance(m, dict)] if isinstance(machines, list) else []
    for i, machine in enumerate(found):
        for key, kind in MACHINE_COLUMNS.items():
            value = machine.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                want = "an integer" if kind is int else "text"
                raise UserError(f"{path}: machines[{i}].{key}={value!r} is not {want}; restore run.json, or delete "
                                "the run directory to train the cell again")
    return found


def store_tokenizer(run_dir: Path, source: Path | None) -> None:
    """Keep a copy of the run's tokenizer.json (source; None for the byte tokenizer) as run_dir/tokenizer.json;
    UserError when the run already holds a different one (a resume must use the tokenizer it started with)."""
    if source is None:
        return
    dest = Path(run_dir) / TOKENIZER_FILE
    if dest.is_file():
        if sha256_file(dest) != sha256_file(source):
            raise UserError(f"{dest}: the run's tokenizer differs from the one data.tokenizer gives now ({source}); "
                            "a run keeps the tokenizer it started with: resume with that tokenizer, or pass another "
                            "train.out_dir")
        return
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, dest)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl; a last line still being written is skipped, a corrupt earlier one is a
    UserError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # no newline yet: the writer is mid-line
                break
            raise UserError(f"{path}:{i}: not a JSON line; the file is corrupt (delete the line or the run)") from None
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            records.append(rec)
    return records


def metrics_at(records: list[dict[str, Any]], step: int) -> dict[str, float]:
    """The metrics recorded at one step (all records of that step merged)."""
    out: dict[str, float] = {}
    for rec in records:
        if rec["step"] == step:
            out.update({k: v for k, v in rec.items() if k != "step"})
    return out


def append_metrics(path: Path, step: int, metrics: dict[str, float]) -> None:
    """Append one record (non-finite values written as null)."""
    clean = {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, **clean}) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop every record after `step` (a resumed run replays those steps)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [rec for rec in read_metrics(path) if rec["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(rec) + "\n" for rec in kept))
    os.replace(tmp, path)
