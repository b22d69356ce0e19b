"""The docs' tables of a shipped `hdrope bench length` result (`experiments/results/<name>/bench.json`), checked
against one schema when read, and the issue-45 targets they are read against.

`analysis.docs_results` renders a `<!-- results:<name>:<table> -->` block from here when the folder holds a
bench.json: `memory` and `time` (every kind × length, with the ratio to RoPE's), `targets` (each kind at the
targets' length against its target) and `paths` (which attention path each kind takes on each device, from the
registry). A truncated, retyped or foreign file is refused, naming the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hdrope.errors import UserError

__all__ = ["BENCH_FILE", "BENCH_TABLES", "MEMORY_ALONE_FILE", "TARGETS", "TARGET_LENGTH", "load_length_bench",
           "memory_slopes", "missed_targets", "render_bench"]

BENCH_FILE = "bench.json"
MEMORY_ALONE_FILE = "memory_alone.json"  # `hdrope bench length --memory-alone` at lengths past the bench's
TARGET_LENGTH = 2048
MEMORY_TARGET = 1.5  # every kind's peak memory within 1.5x RoPE's at the target length
# step time within this many times RoPE's at the target length (issue 45); kinds not named have no target
TARGETS = {**dict.fromkeys(("alibi", "kerple", "t5_bias", "fox", "grape_a", "liere"), 2.0),
           **dict.fromkeys(("fire", "cope", "dape", "stickbreaking", "path"), 4.0)}
LINEAR_SLOPE = 1.3  # a memory slope over log length below this is linear (1), above it toward quadratic (2)
_ROW = {"kind": str, "length": int, "step_s": float, "step_vs_rope": float, "memory_mb": float,
        "memory_vs_rope": float, "tokens_per_s": float, "mfu": float, "mfu_vs_rope": float}
_TOP = {"preset": str, "batch": int, "threads": int, "device": str, "rounds": int, "torch": str, "lengths": list,
        "rows": list, "slopes": dict}


_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a mapping"}


def _typed(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and not isinstance(value, bool)


def load_length_bench(folder: Path) -> dict[str, Any]:
    """The bench result in folder/bench.json; UserError naming the file and field when it is not one whole
    `hdrope bench length` result (every kind at every length, RoPE among them, finite positive figures)."""
    path = Path(folder) / BENCH_FILE
    fix = "re-run `hdrope bench length --json` into it"
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # missing, unreadable or damaged JSON
        raise UserError(f"{path}: not a readable JSON file ({type(err).__name__}); {fix}") from None
    if not isinstance(res, dict):
        raise UserError(f"{path}: holds a {type(res).__name__}, not a bench result; {fix}")
    for key, kind in _TOP.items():
        if not _typed(res.get(key), kind):
            raise UserError(f"{path}: field {key!r} is {res.get(key)!r}, not {_NAMES[kind]}; {fix}")
    for i, row in enumerate(res["rows"]):
        for key, kind in _ROW.items():
            value = row.get(key) if isinstance(row, dict) else None
            if not _typed(value, kind) or (kind is float and not (math.isfinite(value) and value > 0)):
                want = "a finite number > 0" if kind is float else _NAMES[kind]
                raise UserError(f"{path}: rows[{i}].{key} is {value!r}, not {want}; {fix}")
    for i, again in enumerate(res.get("remeasured", [])):
        if not (isinstance(again, dict) and isinstance(again.get("kinds"), list) and again["kinds"]
                and isinstance(again.get("when"), str)):
            raise UserError(f"{path}: remeasured[{i}] is {again!r}, not a mapping with kinds and when; {fix}")
    cells = {(r["kind"], r["length"]) for r in res["rows"]}
    kinds = {r["kind"] for r in res["rows"]}
    missing = sorted((k, n) for k in kinds for n in res["lengths"] if (k, n) not in cells)
    if "rope" not in kinds or missing or len(cells) != len(res["rows"]):
        rope = "present" if "rope" in kinds else "absent"
        raise UserError(f"{path}: not every kind at every length once (RoPE {rope}, missing {missing[:3]}); {fix}")
    alone = Path(folder) / MEMORY_ALONE_FILE
    if alone.is_file():
        res["memory_alone"] = _memory_alone(alone, res, kinds)
    return res


def _memory_alone(path: Path, res: dict[str, Any], kinds: set[str]) -> dict[int, dict[str, float]]:
    """memory_alone.json read against its bench: the same preset, batch, threads and machine, lengths past the
    bench's, and every kind's finite positive memory at each."""
    fix = "re-run `hdrope bench length --memory-alone --json` into it at the bench's settings"
    try:
        alone = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # missing, unreadable or damaged JSON
        raise UserError(f"{path}: not a readable JSON file ({type(err).__name__}); {fix}") from None
    if not isinstance(alone, dict) or not isinstance(alone.get("memory_mb"), dict):
        raise UserError(f"{path}: field 'memory_mb' is missing or not a mapping; {fix}")
    for key in ("preset", "batch", "threads", "device"):
        if alone.get(key) != res[key]:
            raise UserError(f"{path}: field {key!r} is {alone.get(key)!r}, the bench's is {res[key]!r}; {fix}")
    out = {}
    for length, by_kind in alone["memory_mb"].items():
        if not (length.isdigit() and int(length) > max(res["lengths"])) or not isinstance(by_kind, dict):
            raise UserError(f"{path}: memory_mb[{length!r}] is not a length past the bench's {res['lengths']}; {fix}")
        bad = sorted(k for k in kinds if not (_typed(by_kind.get(k), float) and math.isfinite(by_kind[k])
                                              and by_kind[k] > 0))
        if bad:
            raise UserError(f"{path}: memory_mb[{length!r}][{bad[0]!r}] is {by_kind.get(bad[0])!r}, not a finite "
                            f"number > 0; {fix}")
        out[int(length)] = {k: float(by_kind[k]) for k in kinds}
    return out


def memory_slopes(res: dict[str, Any]) -> dict[str, float]:
    """Each kind's memory slope over every length measured: the bench's own, or refit with the lengths measured
    alone past it (the least-squares slope of log memory on log length)."""
    alone = res.get("memory_alone") or {}
    if not alone:
        return dict(res["slopes"])
    from trainer.model.bench_length import memory_slope  # the bench's own definition of the slope

    out = {}
    for kind in res["slopes"]:
        points = [(r["length"], r["memory_mb"]) for r in res["rows"] if r["kind"] == kind]
        points += [(n, by[kind]) for n, by in sorted(alone.items())]
        out[kind] = memory_slope([p[0] for p in points], [p[1] for p in points])
    return out


def _last_length(res: dict[str, Any]) -> int:
    return max([*res["lengths"], *(res.get("memory_alone") or {})])


def _cells(res: dict[str, Any], value: str, ratio: str, digits: int) -> str:
    by = {(r["kind"], r["length"]): r for r in res["rows"]}
    head = ["kind", *(f"{n}" for n in res["lengths"])]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(res["lengths"])]
    for kind in dict.fromkeys(r["kind"] for r in res["rows"]):
        cells = [f"{by[(kind, n)][value]:.{digits}f} ({by[(kind, n)][ratio]:.2f}×)" for n in res["lengths"]]
        lines.append(f"| `{kind}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _memory(res: dict[str, Any]) -> str:
    return _cells(res, "memory_mb", "memory_vs_rope", 0)


def _time(res: dict[str, Any]) -> str:
    return _cells(res, "step_s", "step_vs_rope", 2)


def _at_target_length(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    at = {r["kind"]: r for r in res["rows"] if r["length"] == TARGET_LENGTH}
    if not at:
        raise UserError(f"the bench has no rows at the targets' length {TARGET_LENGTH}")
    return at


def _met(res: dict[str, Any], kind: str, r: dict[str, Any]) -> bool:
    target = TARGETS.get(kind)
    return r["memory_vs_rope"] <= MEMORY_TARGET and memory_slopes(res).get(kind, math.nan) < LINEAR_SLOPE and (
        target is None or r["step_vs_rope"] <= target)


def missed_targets(res: dict[str, Any]) -> list[str]:
    """The kinds a bench result shows missing a target (memory, its slope, or step time at the targets' length)."""
    return sorted(kind for kind, r in _at_target_length(res).items() if not _met(res, kind, r))


def _targets(res: dict[str, Any]) -> str:
    at = _at_target_length(res)
    lines = [f"| kind | memory × RoPE at {TARGET_LENGTH} (target ≤ {MEMORY_TARGET}) | step × RoPE at {TARGET_LENGTH} "
             f"| step target | memory slope, {min(res['lengths'])} to {_last_length(res)} | met |",
             "|---|---:|---:|---:|---:|---|"]
    slopes = memory_slopes(res)
    for kind, r in at.items():
        slope = slopes.get(kind, float("nan"))
        target = TARGETS.get(kind)
        met = _met(res, kind, r)
        shape = "linear" if slope < LINEAR_SLOPE else "not linear"
        bound = "—" if target is None else f"≤ {target:g}"
        lines.append(f"| `{kind}` | {r['memory_vs_rope']:.2f} | {r['step_vs_rope']:.2f} | {bound} | {slope:.2f} "
                     f"({shape}) | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def _paths(res: dict[str, Any]) -> str:
    from trainer.model.attention.paths import choose_path
    from trainer.model.position import POSITION_ENCODINGS, encoding_class, pe_config_class
    from trainer.presets import load_model_args

    shape = load_model_args(res["preset"]).encoding_shape
    lines = ["| kind | scores | CPU, one tile or less | CPU, longer | CUDA, training | CUDA, longer evaluation |",
             "|---|---|---|---|---|---|"]
    for kind in sorted(POSITION_ENCODINGS):
        module = encoding_class(pe_config_class(kind)(kind=kind), shape)
        scores = module.scores_kind()
        cells = [choose_path("auto", scores, device, training, n, n, True, fused=module.fuses())
                 for device, training, n in (("cpu", True, 256), ("cpu", True, 8192), ("cuda", True, 8192),
                                             ("cuda", False, 32768))]
        lines.append(f"| `{kind}` | {scores} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _alone(res: dict[str, Any]) -> str:
    alone = res.get("memory_alone") or {}
    if not alone:
        raise UserError(f"the bench has no {MEMORY_ALONE_FILE} (run `hdrope bench length --memory-alone --json`)")
    lengths = sorted(alone)
    lines = ["| kind | " + " | ".join(f"{n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for kind in res["slopes"]:
        lines.append(f"| `{kind}` | " + " | ".join(f"{alone[n][kind]:.0f} ({alone[n][kind] / alone[n]['rope']:.2f}×)"
                                                 for n in lengths) + " |")
    return "\n".join(lines)


# table name -> what it renders from a shipped bench result
BENCH_TABLES = {"memory": _memory, "time": _time, "targets": _targets, "paths": _paths, "memory-alone": _alone}


def render_bench(folder: Path, table: str) -> str:
    """The body of a results block of a shipped bench result (a table of BENCH_TABLES)."""
    if table not in BENCH_TABLES:
        raise UserError(f"results block {Path(folder).name}:{table}: no bench table {table!r}; choose one of "
                        f"{sorted(BENCH_TABLES)}")
    res = load_length_bench(folder)
    notes = [] if table in ("paths", "memory-alone") else [_remeasured(again) for again in res.get("remeasured", [])]
    return "\n".join([BENCH_TABLES[table](res), *(["", *notes] if notes else [])]) + "\n"


def _remeasured(again: dict[str, Any]) -> str:
    kinds = ", ".join(f"`{k}`" for k in again["kinds"])
    return (f"_{kinds}: re-measured on {again['when']} after a change to {'it' if len(again['kinds']) == 1 else 'them'}"
            f" alone (`hdrope bench length --update`), beside RoPE in a run of its own; its ratios are to that run's "
            "RoPE._")
