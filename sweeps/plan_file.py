"""The plan on disk: `save_plan` writes spec.yaml and plan.json, `load_plan` reads them back as a typed `Plan`.

The one module that knows plan.json. Everything after planning (the driver, Tune's trials and callback, results,
resume, report, notebooks) holds the typed `Plan`: its `SweepSpec` and one `Cell` per grid point with a resolved
`RunConfig`, parsed once here. The file format is unchanged since plans were first written (name, root, the spec
and each cell's config as YAML, values, config hash, dedup group, dedup_of), so older sweeps still load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hdrope.errors import UserError
from sweeps.plan import Cell, Plan
from sweeps.spec import SweepSpec, check_name
from trainer.presets import config_yaml, merge_config, refuse_interpolations

__all__ = ["PLAN_FILE", "find_plan", "load_plan", "save_plan"]

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
                              "config_hash": c.config_hash, "group": c.group, "dedup_of": c.dedup_of}
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


def load_plan(sweep_dir: str | Path) -> Plan:
    """The plan stored in sweep_dir/plan.json, typed, with every path taken from where sweep_dir is now.

    The stored `root` and cell `train.out_dir`s are never trusted: a copied or moved sweep writes into itself, and an
    edited plan cannot write outside it. A corrupt or tampered plan is a UserError naming the file and the fix."""
    root = Path(sweep_dir).resolve()
    path = root / PLAN_FILE
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: unreadable ({type(err).__name__}: truncated or not JSON); {_FIX}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("cells"), dict) or "spec" not in payload:
        raise UserError(f"{path}: not a plan written by `hdrope sweep` (no cells/spec); {_FIX}")
    check_name(payload.get("name"), f"{path}: name")
    spec = _spec(_yaml(payload["spec"], f"{path}: spec"), f"{path}: spec")
    cells = []
    for cell_id, cell in payload["cells"].items():
        check_name(cell_id, f"{path}: cell id")
        where = f"{path}: cell {cell_id}"
        node = _yaml(cell.get("config", "") if isinstance(cell, dict) else None, where)
        node.train.out_dir = str(root / "cells" / cell_id)
        cells.append(Cell(cell_id, dict(cell.get("values") or {}), merge_config([node], where=where),
                          cell.get("config_hash"), cell.get("group"), cell.get("dedup_of")))
    return Plan(spec, cells, root)


def find_plan(name: str, storage: str = "runs/sweeps") -> Plan:
    """The stored plan of sweep `name` (a name under storage, or a sweep directory path)."""
    path = Path(name)
    if not (path / PLAN_FILE).is_file():
        check_name(name, "sweep name")
        path = Path(storage) / name
    if not (path / PLAN_FILE).is_file():
        raise UserError(f"no sweep {name!r} under {storage!r} (no plan.json); pass --storage or the sweep directory")
    return load_plan(path)
