"""The plan on disk: `save_plan` writes spec.yaml and plan.json, `load_plan` reads them back as a typed `Plan`.

The one module that knows plan.json. Everything after planning (the driver, Tune's trials and callback, resume,
report, notebooks) holds the typed `Plan`: its `SweepSpec` and one `Cell` per grid point with a resolved
`RunConfig`, parsed once here. `hdrope sweep status` and `hdrope sweep results` build no model and read a
`PlanRecord` instead (`find_plan_record`): each cell's ids, values and hash, its encoding identity as stored at plan
time, and its seed, steps and planned metrics from its config read untyped, so they load neither torch nor the
encoding registry. The file format only grew since plans were first written (name, root, the spec and each cell's
config as YAML, values, config hash, dedup group, dedup_of; since issue 47 each cell's `identity` row), so older
sweeps still load: a plan without identities is read typed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hdrope.errors import UserError
from sweeps.plan import Cell, Plan, SpecAxes
from sweeps.spec import SweepSpec, check_name
from trainer.config import RunConfig, metric_names
from trainer.model.identity import IDENTITY_COLUMNS
from trainer.model.pe_schedule import run_identity
from trainer.presets import config_yaml, merge_config, refuse_interpolations

__all__ = ["PLAN_FILE", "CellRecord", "PlanRecord", "cell_record", "find_plan", "find_plan_record", "load_plan",
           "plan_record", "read_plan_record", "save_plan"]

PLAN_FILE = "plan.json"
_FIX = "restore it from a copy, or run the spec again under a new name"


def _payload(plan: Plan) -> dict[str, Any]:
    """plan.json's content: plain data (the spec and each cell's config as YAML)."""
    return {
        "name": plan.spec.name,
        "root": str(plan.root),
        "spec": OmegaConf.to_yaml(OmegaConf.structured(plan.spec)),
        "space": list(plan.spec.search.space),
        "axes": plan.axes,
        "seed_axes": plan.seed_axes,
        "required_metric": plan.required_metric,
        "cells": {c.cell_id: {"config": config_yaml(c.config), "values": c.values,
                              "config_hash": c.config_hash, "group": c.group, "dedup_of": c.dedup_of,
                              "identity": run_identity(c.config)}
                  for c in _stored_cells(plan)},
    }


def _stored_cells(plan: Plan) -> list[Cell]:
    """The cells plan.json holds: a grid's; an Optuna sweep's trials are named as they are sampled."""
    return plan.cells if plan.spec.search.kind == "grid" else []


def save_plan(plan: Plan) -> Plan:
    """Write spec.yaml and plan.json into the plan's sweep directory and return the plan as stored.

    A different plan under the same name is refused. A plan stored by an older version whose cells have the same
    configs in the same order under other ids (cell ids of mapping axes were Python reprs) keeps its stored ids, so
    its cell directories stay in use: the returned plan then carries those ids."""
    plan.root.mkdir(parents=True, exist_ok=True)
    if (plan.root / PLAN_FILE).is_file():
        old = load_plan(plan.root)
        if [c.config_hash for c in old.cells] != [c.config_hash for c in _stored_cells(plan)]:
            raise UserError(
                f"sweep {plan.spec.name!r} already exists at {plan.root} with a different plan; "
                "give the new sweep another name, or finish the old one with `hdrope sweep resume`"
            )
        plan = Plan(plan.spec, old.cells or plan.cells, plan.root, plan.warnings)
    payload = _payload(plan)
    (plan.root / "spec.yaml").write_text(payload["spec"])
    tmp = plan.root / f".{PLAN_FILE}.tmp"
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(plan.root / PLAN_FILE)
    return plan


def _yaml(text: Any, where: str) -> DictConfig:
    """A YAML mapping stored in a plan, with no interpolations; UserError when it is not one."""
    try:
        node = OmegaConf.create(text) if isinstance(text, str) else None
    except Exception as err:  # a damaged text: PyYAML raises Key/Index/Type/Attribute/ValueErrors for bad !!tags
        raise UserError(f"{where}: not a valid YAML mapping ({type(err).__name__}); {_FIX}") from None
    if not isinstance(node, DictConfig):
        raise UserError(f"{where}: not a YAML mapping; {_FIX}")
    refuse_interpolations(node, where)
    return node


def _spec(node: DictConfig, where: str) -> SweepSpec:
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweepSpec), node))
    except OmegaConfBaseException as err:
        raise UserError(f"{where}: {str(err).splitlines()[0]}; {_FIX}") from None


def _read(sweep_dir: str | Path) -> tuple[Path, dict[str, Any], SweepSpec]:
    """The path of sweep_dir's plan.json (resolved), its content and its typed spec; UserError when damaged."""
    path = Path(sweep_dir).resolve() / PLAN_FILE
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: unreadable ({type(err).__name__}: truncated or not JSON); {_FIX}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("cells"), dict) or "spec" not in payload:
        raise UserError(f"{path}: not a plan written by `hdrope sweep` (no cells/spec); {_FIX}")
    check_name(payload.get("name"), f"{path}: name")
    return path, payload, _spec(_yaml(payload["spec"], f"{path}: spec"), f"{path}: spec")


def _cells(path: Path, payload: dict[str, Any]) -> list[tuple[str, dict[str, Any], DictConfig, str]]:
    """Each stored cell: its id, its plan.json entry, its config untyped (writing into its cell directory where the
    sweep is now) and where it is (for messages)."""
    found = []
    for cell_id, cell in payload["cells"].items():
        check_name(cell_id, f"{path}: cell id")
        where = f"{path}: cell {cell_id}"
        node = _yaml(cell.get("config", "") if isinstance(cell, dict) else None, where)
        node.train.out_dir = str(path.parent / "cells" / cell_id)
        found.append((cell_id, cell, node, where))
    return found


def load_plan(sweep_dir: str | Path) -> Plan:
    """The plan stored in sweep_dir/plan.json, typed, with every path taken from where sweep_dir is now.

    The stored `root` and cell `train.out_dir`s are never trusted: a copied or moved sweep writes into itself, and an
    edited plan cannot write outside it. A corrupt or tampered plan is a UserError naming the file and the fix."""
    path, payload, spec = _read(sweep_dir)
    cells = [Cell(cell_id, dict(cell.get("values") or {}), merge_config([node], where=where),
                  cell.get("config_hash"), cell.get("group"), cell.get("dedup_of"))
             for cell_id, cell, node, where in _cells(path, payload)]
    return Plan(spec, cells, path.parent)


@dataclass(frozen=True)
class CellRecord:
    """A planned cell as `hdrope sweep status` and `hdrope sweep results` read it: its ids, axis values and config
    hash (None for an Optuna trial: its result says it), its encoding identity (the columns of IDENTITY_COLUMNS),
    and its config's seed, steps and planned metrics (`trainer.config.metric_names`)."""

    cell_id: str
    values: dict[str, Any]
    config_hash: str | None
    dedup_of: str | None
    identity: dict[str, Any]
    seed: int
    steps: int
    metrics: list[str]


@dataclass(frozen=True)
class PlanRecord(SpecAxes):
    """A sweep as its status and results read it: the spec, the sweep directory and the stored cells' records."""

    spec: SweepSpec
    cells: list[CellRecord]
    root: Path


def cell_record(cell_id: str, values: dict[str, Any], cfg: RunConfig | DictConfig, config_hash: str | None,
                dedup_of: str | None, identity: dict[str, Any] | None = None) -> CellRecord:
    """The record of a cell of config cfg: a typed RunConfig, whose identity is computed (`run_identity`), or a
    stored config read untyped with its stored identity."""
    return CellRecord(cell_id, values, config_hash, dedup_of, run_identity(cfg) if identity is None else identity,
                      int(cfg.train.seed), int(cfg.train.steps), metric_names(cfg))


def plan_record(plan: Plan | PlanRecord) -> PlanRecord:
    """The record of a typed plan (its stored cells, each computed from its config); a record as it is."""
    if isinstance(plan, PlanRecord):
        return plan
    return PlanRecord(plan.spec, [cell_record(c.cell_id, c.values, c.config, c.config_hash, c.dedup_of)
                                  for c in _stored_cells(plan)], plan.root)


def _identity(row: Any, where: str) -> dict[str, Any]:
    """A cell's stored identity row; UserError naming the column when it is not one of IDENTITY_COLUMNS' types."""
    if not isinstance(row, dict) or set(row) != set(IDENTITY_COLUMNS):
        raise UserError(f"{where}: identity={row!r} is not a row of the columns {list(IDENTITY_COLUMNS)}; {_FIX}")
    for key, kind in IDENTITY_COLUMNS.items():
        allowed = (int, float) if kind is float else (kind,)
        if row[key] is not None and (not isinstance(row[key], allowed) or isinstance(row[key], bool)):
            raise UserError(f"{where}: identity {key}={row[key]!r} must be of type {kind.__name__} or null; {_FIX}")
    return {key: row[key] for key in IDENTITY_COLUMNS}


def _light_record(cell_id: str, cell: dict[str, Any], node: DictConfig, where: str) -> CellRecord:
    """The record of a stored cell with its stored identity, its config untyped; UserError when the config lacks
    a key the record reads or holds a value of the wrong type."""
    identity = _identity(cell["identity"], where)
    try:
        return cell_record(cell_id, dict(cell.get("values") or {}), node, cell.get("config_hash"), cell.get("dedup_of"),
                           identity)
    except (OmegaConfBaseException, KeyError, TypeError, ValueError) as err:  # a damaged config: a missing key, an
        # unknown task (KeyError) or a value that is not a number (int() raises TypeError/ValueError), nothing else
        raise UserError(f"{where}: config {type(err).__name__}: {str(err).splitlines()[0]}; {_FIX}") from None


def read_plan_record(sweep_dir: str | Path) -> PlanRecord:
    """The record of the plan stored in sweep_dir, read without typing any cell's config (no torch, no encoding
    registry); a plan stored before cells kept their identity is read typed (`load_plan`)."""
    path, payload, spec = _read(sweep_dir)
    if not all(isinstance(cell, dict) and "identity" in cell for cell in payload["cells"].values()):
        return plan_record(load_plan(path.parent))
    return PlanRecord(spec, [_light_record(*found) for found in _cells(path, payload)], path.parent)


def _plan_dir(name: str, storage: str) -> Path:
    """The directory of sweep `name` (a name under storage, or a sweep directory path)."""
    path = Path(name)
    if not (path / PLAN_FILE).is_file():
        check_name(name, "sweep name")
        path = Path(storage) / name
    if not (path / PLAN_FILE).is_file():
        raise UserError(f"no sweep {name!r} under {storage!r} (no plan.json); pass --storage or the sweep directory")
    return path


def find_plan(name: str, storage: str = "runs/sweeps") -> Plan:
    """The stored plan of sweep `name` (a name under storage, or a sweep directory path)."""
    return load_plan(_plan_dir(name, storage))


def find_plan_record(name: str, storage: str = "runs/sweeps") -> PlanRecord:
    """The record of sweep `name`'s stored plan (a name under storage, or a sweep directory path), as its status and
    results read it."""
    return read_plan_record(_plan_dir(name, storage))
