"""Resolve a spec into a validated plan: every grid cell's full RunConfig, its id, hash and dedup group.

Nothing runs until every cell is valid; all problems come out in one `SpecError`. Cells that are
provably the same model share a dedup group and train once; which settings are irrelevant is the
encoding registry's call (`trainer.model.position.dedup_pe`: N = 2 with any basis is RoPE, NOTES §1; the
seed of a non-random basis is unused; `nope` ignores every rotary setting; `fused` is another kernel).
Importing this module loads no torch (a stored plan's readers import `Plan`); planning does.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hdrope.errors import UserError
from sweeps.spec import SpecError, SweepSpec, check_name
from trainer.config import RunConfig, config_errors, config_hash, metric_names
from trainer.data.tasks.fit import task_fit_problems
from trainer.labels import value_label
from trainer.model.pe_layers import stack_dedup
from trainer.presets import merge_config, preset_layer

__all__ = ["ALIASES", "SEED_KEYS", "Cell", "Plan", "cell_config", "make_plan", "metric_driven", "seed_axes",
           "spec_axes", "sweep_dir"]

ALIASES = {"seed": "train.seed"}
MAX_CELLS = 10_000  # a larger grid is almost surely a typo; plan refuses it before resolving a single cell
RAY_RESOURCE_UNIT = 1e-4  # Ray's resource granularity (ray._private.ray_constants.MIN_RESOURCE_GRANULARITY)
RAY_RESOURCE_MAX = (2**63 - 1) * RAY_RESOURCE_UNIT  # Ray counts resources as int64 multiples of its unit
SEED_KEYS = ("train.seed", "model.pe.seed")  # replicate axes: a report averages over them, never groups by them
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Cell:
    """One grid point: its axis values, resolved config, config hash and dedup representative."""

    cell_id: str
    values: dict[str, Any]
    config: RunConfig
    config_hash: str
    group: str  # config hash of the canonical (dedup) config
    dedup_of: str | None = None  # cell_id of the representative that actually trains, if not itself


class SpecAxes:
    """The axes of a sweep as its spec gives them, for a plan (typed or read light) that holds `spec`."""

    spec: SweepSpec

    @property
    def axes(self) -> list[str]:
        """The keys cells differ by: the grid's axes, or an Optuna search's dimensions."""
        return spec_axes(self.spec)

    @property
    def seed_axes(self) -> list[str]:
        """The axes that are seeds (a report averages over them)."""
        return seed_axes(self.axes)


@dataclass
class Plan(SpecAxes):
    """The validated sweep: cells in grid order and where everything goes."""

    spec: SweepSpec
    cells: list[Cell]
    root: Path
    warnings: list[str] = field(default_factory=list)

    @property
    def to_run(self) -> list[Cell]:
        return [c for c in self.cells if c.dedup_of is None]

    def cell(self, cell_id: str) -> Cell:
        return next(c for c in self.cells if c.cell_id == cell_id)

    @property
    def compares(self) -> bool:
        """Whether cells differ by something other than a seed (a report compares them)."""
        seeds = set(self.seed_axes)
        return any(len(v) > 1 for k, v in self.spec.axes.items() if k not in seeds)

    @property
    def required_metric(self) -> str | None:
        """The metric every intermediate result must carry (for a searcher or scheduler), else None."""
        return self.spec.search.metric if metric_driven(self.spec) else None

    def trial_cell(self, trial_config: dict[str, Any]) -> Cell:
        """The cell a Tune trial trains: a planned grid cell (`{"cell": id}`), or an Optuna sample, named
        t-<hash of its values> and resolved like a grid cell."""
        if "cell" in trial_config:
            return self.cell(trial_config["cell"])
        values = {k: trial_config[k] for k in self.spec.search.space}
        digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]
        cell_id = f"t-{digest}"
        cfg = cell_config(self.spec, values, cell_id, self.root / "cells" / cell_id)
        return Cell(cell_id, values, cfg, config_hash(cfg), config_hash(cfg))

    def summary(self) -> dict[str, Any]:
        """Counts and resources, as `hdrope sweep plan` prints them."""
        r = self.spec.resources
        cpus = os.cpu_count() or 1
        fit = int(cpus // max(r.cpus * r.workers, 1e-9) + 1e-9)
        fit = fit if r.workers > 1 else max(1, fit)  # a Train run starts only when all its workers fit
        gpus = r.gpus if r.workers == 1 else r.gpus_per_worker * r.workers
        if gpus > 0:  # fractional GPUs share a device: 0.25 -> four trials per GPU
            fit = min(fit, int(local_gpus() // gpus + 1e-9))
        concurrent = min(fit, self.spec.max_concurrent or fit)
        optuna = self.spec.search.kind == "optuna"
        return {"name": self.spec.name, "dir": str(self.root), "cells": len(self.cells),
                "trials_run": self.spec.search.n_trials if optuna else len(self.to_run),
                "trials_saved": 0 if optuna else len(self.cells) - len(self.to_run),
                "search": self.spec.search.kind, "scheduler": self.spec.scheduler,
                "per_trial": {"cpus": r.cpus * r.workers, "gpus": gpus, "workers": r.workers},
                "concurrent_here": concurrent, "total_steps": sum(c.config.train.steps for c in self.to_run)}


def local_gpus() -> int:
    """CUDA devices on this machine (0 without torch's CUDA build); only asked when a spec wants GPUs."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def sweep_dir(spec: SweepSpec) -> Path:
    """storage/name, resolved; the name was checked to stay inside storage."""
    return (Path(spec.storage).expanduser() / spec.name).resolve()


def _slug(values: dict[str, Any]) -> str:
    """The axis values as a cell-id suffix; a mapping value by its label (`optimSGD_lr_0.1_m_0.9_wd_0`)."""
    parts = []
    for key, v in values.items():
        short = key.rsplit(".", 1)[-1]
        if isinstance(v, Mapping):
            parts.append(_SLUG.sub("_", f"{short}{value_label(v)}").rstrip("_"))
        else:
            parts.append(_SLUG.sub("_", f"{short}{v:g}" if isinstance(v, float) else f"{short}{v}"))
    return "-".join(parts)


def _layer(items: dict[str, Any]):
    layer = OmegaConf.create({})
    for key, value in items.items():
        try:
            OmegaConf.update(layer, ALIASES.get(key, key), copy.deepcopy(value), force_add=True)
        except (OmegaConfBaseException, ValueError):  # omegaconf: ValueError for a dotted key into a list's items
            raise UserError(f"spec: {key}={value!r} cannot be set: another key of the same section makes a list "
                            "above it; set the list itself or its items, not both") from None
    return layer


def cell_config(spec: SweepSpec, values: dict[str, Any], name: str, out_dir: Path,
                base: DictConfig | None = None, overrides: DictConfig | None = None) -> RunConfig:
    """The full RunConfig of one cell: base preset, spec overrides, the cell's axis values, sweep wiring.

    `base` and `overrides` are the preset's and the spec overrides' layers when the caller already built them (a
    plan builds them once for all cells; merging never changes a layer)."""
    wiring: dict[str, Any] = {"name": name, "train.out_dir": str(out_dir)}
    if spec.checkpoint_every:
        wiring["train.ckpt_every"] = spec.checkpoint_every
    layers = [base if base is not None else preset_layer(spec.base),
              overrides if overrides is not None else _layer(spec.overrides), _layer(values), _layer(wiring)]
    cfg = merge_config(layers, where=f"cell {name}")
    if metric_driven(spec) and spec.search.metric in ("val_loss", "val_bpb"):
        cfg.train.eval_every = cfg.train.log_every  # the searcher/scheduler sees the metric in every report
    return cfg


def spec_axes(spec: SweepSpec) -> list[str]:
    """The keys a spec's cells differ by: the grid's axes, or an Optuna search's dimensions."""
    return list(spec.axes) or list(spec.search.space)


def seed_axes(axes: list[str]) -> list[str]:
    """The axis keys (as written in the spec) that are seeds."""
    return [k for k in axes if ALIASES.get(k, k) in SEED_KEYS]


def metric_driven(spec: SweepSpec) -> bool:
    """Whether a searcher or scheduler reads `search.metric` from every intermediate result."""
    return spec.search.kind == "optuna" or spec.scheduler == "asha"


def canonical(cfg: RunConfig) -> RunConfig:
    """The config with every setting that provably cannot change the model put to a fixed value."""
    c = copy.deepcopy(cfg)
    # the encoding registry says which settings are irrelevant, layer by layer in a hybrid stack
    c.model.pe, c.model.pe_layers = stack_dedup(c.model)
    return c


def _check_spec(spec: SweepSpec) -> list[str]:
    p: list[str] = []
    try:
        check_name(spec.name, "name")
    except UserError as err:
        p.append(str(err))
    s = spec.search
    if s.kind not in ("grid", "optuna"):
        p.append(f"search.kind={s.kind!r}: choose grid or optuna")
    if s.kind == "optuna":
        if spec.axes:
            p.append("search.kind=optuna with axes: grid axes cannot be mixed with an Optuna search; "
                     "run one optuna sweep per variant (put the variant in overrides) or use search.kind=grid")
        if not s.space:
            p.append("search.space is empty: optuna needs at least one dimension, e.g. optim.lr: {type: float, ...}")
        if s.sampler not in ("tpe", "random"):
            p.append(f"search.sampler={s.sampler!r}: choose tpe or random")
        if s.n_trials < 1:
            p.append(f"search.n_trials={s.n_trials}: must be >= 1")
        for key, dim in s.space.items():
            where = f"search.space.{key}"
            if dim.type not in ("float", "int", "categorical"):
                p.append(f"{where}.type={dim.type!r}: choose float, int or categorical")
            elif dim.type == "categorical" and not dim.choices:
                p.append(f"{where}.choices is empty: list the values to try")
            elif dim.type != "categorical" and not (dim.low < dim.high and (dim.low > 0 or not dim.log)):
                p.append(f"{where}: need low < high (and low > 0 when log=true), got [{dim.low}, {dim.high}]")
    if s.mode not in ("min", "max"):
        p.append(f"search.mode={s.mode!r}: choose min or max")
    if spec.scheduler not in ("fifo", "asha"):
        p.append(f"scheduler={spec.scheduler!r}: choose fifo (default) or asha")
    if not spec.resources.cpus > 0 or not spec.resources.gpus >= 0:
        p.append(f"resources: cpus must be > 0 and gpus >= 0, got cpus={spec.resources.cpus}, "
                 f"gpus={spec.resources.gpus}")
    p += _worker_problems(spec.resources) + _granularity_problems(spec.resources)
    for key in ("max_concurrent", "max_failures", "checkpoint_every"):
        if getattr(spec, key) < 0:
            p.append(f"{key}={getattr(spec, key)}: must be >= 0")
    for key, values in spec.axes.items():
        if not isinstance(values, list) or not values:
            p.append(f"axes.{key}: must be a non-empty list of values, got {values!r}")
        elif len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
            p.append(f"axes.{key}: has repeated values {values!r}; list each value once")
    for where, value in _numbers(spec):
        if not math.isfinite(value):
            p.append(f"{where}={value!r}: must be a finite number")
    if spec.axes and all(isinstance(v, list) for v in spec.axes.values()):
        size = math.prod(len(v) for v in spec.axes.values())
        if size > MAX_CELLS:
            p.append(f"axes: the grid has {size:,} cells (the product of {len(spec.axes)} axes), over the limit of "
                     f"{MAX_CELLS:,}; split the sweep into several specs or shorten the axes")
    return p


def _worker_problems(r: Any) -> list[str]:
    """What is wrong with the data-parallel worker settings of `resources` (workers, gpus_per_worker, strategy)."""
    from trainer.run.distributed import STRATEGIES

    p: list[str] = []
    if r.workers < 1:
        p.append(f"resources.workers={r.workers}: must be >= 1 (1 trains in the trial's own process, W > 1 runs W "
                 "data-parallel Ray Train workers)")
    if r.strategy not in STRATEGIES:
        p.append(f"resources.strategy={r.strategy!r}: choose one of {', '.join(sorted(STRATEGIES))}")
    if not r.gpus_per_worker >= 0:
        p.append(f"resources.gpus_per_worker={r.gpus_per_worker}: must be >= 0")
    if r.workers == 1 and r.gpus_per_worker > 0:
        p.append(f"resources.gpus_per_worker={r.gpus_per_worker:g} with workers=1: one process trains; "
                 "set resources.gpus instead, or workers >= 2")
    if r.workers > 1 and r.gpus > 0:
        p.append(f"resources.gpus={r.gpus:g} with workers={r.workers}: the trial's own process trains nothing; "
                 "set resources.gpus_per_worker instead")
    return p


def _granularity_problems(r: Any) -> list[str]:
    """Resource amounts Ray cannot schedule: a nonzero amount below its unit of 0.0001 (Ray refuses the request
    once the trial starts), or one too large for its fixed-point counters."""
    p: list[str] = []
    for key in ("cpus", "gpus", "gpus_per_worker"):
        value = getattr(r, key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            continue  # reported by the checks of signs and finite numbers
        if 0 < value < RAY_RESOURCE_UNIT:
            p.append(f"resources.{key}={value!r}: Ray schedules resources in units of {RAY_RESOURCE_UNIT:g}, so "
                     f"this is no amount at all; use {'' if key == 'cpus' else '0 or '}at least {RAY_RESOURCE_UNIT:g}")
        elif value > RAY_RESOURCE_MAX:
            p.append(f"resources.{key}={value!r}: more than Ray can count ({RAY_RESOURCE_MAX:.3g}); give the "
                     "amount one worker needs")
    return p


def _numbers(spec: SweepSpec) -> list[tuple[str, float]]:
    """(key, value) of every float the spec itself holds (resources, Optuna bounds)."""
    found = [("resources.cpus", spec.resources.cpus), ("resources.gpus", spec.resources.gpus),
             ("resources.gpus_per_worker", spec.resources.gpus_per_worker)]
    for key, dim in spec.search.space.items():
        found += [(f"search.space.{key}.low", dim.low), (f"search.space.{key}.high", dim.high)]
    return [(k, float(v)) for k, v in found if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _split_problems(cfg: RunConfig, workers: int) -> list[str]:
    """Whether the cell's global batch splits evenly over the data-parallel workers."""
    if workers > 1 and cfg.train.batch_size % workers:
        return [f"train.batch_size={cfg.train.batch_size} does not split evenly over resources.workers={workers}; "
                f"use a multiple of {workers} (the global batch is divided among the workers)"]
    return []


def _dump_problems(cfg: RunConfig) -> list[str]:
    """The attention dump's byte budget, which a run checks only once its data is loaded (it needs none)."""
    from trainer.evals.attention_dump import check_budget

    try:
        if cfg.dump.enabled:
            check_budget(cfg.dump, cfg.model.n_layers, cfg.model.n_heads, cfg.model.max_seq_len)
    except UserError as err:
        return [str(err)]
    return []


def make_plan(spec: SweepSpec, source: str = "spec") -> Plan:
    """Resolve and validate every cell; SpecError lists every problem with its cell, key, value and fix."""
    from sweeps.design_warnings import design_warnings

    problems = _check_spec(spec)
    base = overrides = None
    try:
        base = preset_layer(spec.base)
    except UserError as err:
        problems.append(f"base: {err}")
    try:
        overrides = _layer(spec.overrides)
    except UserError as err:
        problems.append(f"overrides: {str(err).split(': ', 1)[-1]}")
    if problems:
        raise SpecError(source, problems)
    root = sweep_dir(spec)
    keys = list(spec.axes)
    cells: list[Cell] = []
    combos = list(itertools.product(*(spec.axes[k] for k in keys))) if keys else [()]
    for i, combo in enumerate(combos):
        values = dict(zip(keys, combo, strict=True))
        cell_id = f"c{i:03d}" + (f"-{_slug(values)}" if values else "")
        cell_id = cell_id[:100]
        where = f"cell {cell_id} ({', '.join(f'{k}={v!r}' for k, v in values.items()) or 'no axes'})"
        try:
            cfg = cell_config(spec, values, cell_id, root / "cells" / cell_id, base, overrides)
        except UserError as err:
            problems.append(f"{where}: {str(err).split(': ', 1)[-1]}")
            continue
        errs = config_errors(cfg) + _split_problems(cfg, spec.resources.workers)
        errs = errs or task_fit_problems(cfg) or _dump_problems(cfg)  # what the run checks later needs no data
        if not errs and spec.search.metric not in (names := metric_names(cfg)):
            errs = [f"search.metric={spec.search.metric!r} is not reported by this cell; choose one of {names}"]
        if errs:
            problems.extend(f"{where}: {e}" for e in errs)
            continue
        group = config_hash(canonical(cfg)) if spec.dedup else config_hash(cfg)
        cells.append(Cell(cell_id, values, cfg, config_hash(cfg), group))
    if spec.search.kind == "optuna":  # every dimension must resolve at both ends of its range
        for key, dim in spec.search.space.items():
            for value in (list(dim.choices) if dim.type == "categorical" else [dim.low, dim.high]):
                value = int(value) if dim.type == "int" else value
                try:
                    probe = cell_config(spec, {key: value}, "probe", root / "cells" / "probe", base, overrides)
                    errs = config_errors(probe) or task_fit_problems(probe)
                except UserError as err:
                    errs = [str(err).split(": ", 1)[-1]]
                problems.extend(f"search.space.{key}={value!r}: {e}" for e in errs)
    found: list[str] = []
    if not problems:  # checks and warnings other packages own (the declared questions), on the resolved cells
        from sweeps.console import plan_findings

        problems, found = plan_findings(Plan(spec, cells, root))
    if problems:
        raise SpecError(source, problems)
    first: dict[str, str] = {}
    for c in cells:
        rep = first.setdefault(c.group, c.cell_id)
        c.dedup_of = None if rep == c.cell_id else rep
    notes = []
    if spec.scheduler == "asha":
        notes.append("scheduler=asha stops weak trials early: ablation tables will have holes (use fifo for tables)")
        warnings.warn(notes[-1], stacklevel=2)
    if (spec.resources.gpus > 0 or spec.resources.gpus_per_worker > 0) and local_gpus() == 0:
        gpus = spec.resources.gpus or spec.resources.gpus_per_worker
        key = "gpus" if spec.resources.gpus else "gpus_per_worker"
        notes.append(f"resources.{key}={gpus:g}: this machine has no GPU, so its embedded Ray cannot "
                     "run these trials; submit the sweep to a cluster with GPUs (--address)")
    plan = Plan(spec, cells, root, notes)
    plan.warnings += design_warnings(plan.cells, plan.compares)  # what the design cannot measure (docs/sweeps.md)
    plan.warnings += found  # what other packages find it cannot answer (the declared questions)
    return plan
