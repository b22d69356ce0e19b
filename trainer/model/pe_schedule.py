"""`train.pe_schedule`: the position encoding changed at given steps of training. DroPE (arXiv 2512.12167,
SakanaAI/DroPE) is its case: train with RoPE, remove it at step S, and recalibrate the model without it briefly.

Entries `{step: S, pe: SECTION, lr: LR}`, in increasing step, each S in 1..train.steps - 1: from step S on (once S
updates are done: the evaluations and checkpoint at S, and every later update) every layer takes SECTION, a whole
`model.pe` of its kind (at that kind's defaults where unset, as in `model.pe_layers`); with `lr`, the learning rate
is LR from then on instead of the optim schedule's (DroPE's recalibration rate). The run's model at any step is the
encoding then in force (`model_args_at`): evaluations, dumps, checkpoints and `load_trained` read it so, and the final
evaluation reads the model as it ends.

Only encodings with nothing to carry over may be switched from or to: no parameters and no saved state (RoPE,
HD-RoPE with a fixed basis, NoPE, ALiBi, xPos, ...). A kind with parameters (FIRE's MLP, a learned basis) would
leave them behind or start new ones untrained, so a schedule through one is refused. A schedule over a hybrid stack
(`model.pe_layers`) is refused too. A scheduled run is its own variant: pe_kind `scheduled`, labelled
'RoPE → NoPE at step S' (`run_identity`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hdrope.errors import UserError

__all__ = ["SCHEDULED_KIND", "Switch", "lr_override", "model_args_at", "pe_at", "run_identity", "schedule",
           "schedule_problems", "switch_encoding"]

SCHEDULED_KIND = "scheduled"  # the identity's pe_kind of a run whose encoding changes during training
_KEYS = ("step", "pe", "lr")
_EXAMPLE = "e.g. train.pe_schedule=[{step: 900, pe: {kind: nope}, lr: 3.0e-4}]"


@dataclass(frozen=True)
class Switch:
    """One entry of the schedule: from `step` on, every layer takes `pe`; `lr` (None: the optim schedule's)."""

    step: int
    pe: Any
    lr: float | None


def _entries(cfg: Any) -> list[tuple[Mapping, str]]:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    raw = cfg.train.pe_schedule
    raw = OmegaConf.to_container(raw) if isinstance(raw, (DictConfig, ListConfig)) else raw
    if not isinstance(raw, list):
        raise UserError(f"train.pe_schedule={raw!r}: must be a list of {{step, pe, lr}} entries, {_EXAMPLE}")
    out = []
    for i, entry in enumerate(raw):
        where = f"train.pe_schedule[{i}]"
        if not isinstance(entry, Mapping) or not {"step", "pe"} <= set(entry) or not set(entry) <= set(_KEYS):
            keys = sorted(entry) if isinstance(entry, Mapping) else entry
            raise UserError(f"{where}={keys!r}: an entry has the keys step and pe (and optionally lr), {_EXAMPLE}")
        out.append((entry, where))
    return out


def schedule(cfg: Any) -> list[Switch]:
    """The run's switches, typed, in step order; UserError naming the entry, the value and the fix."""
    from trainer.model.pe_layers import typed_section

    switches: list[Switch] = []
    for entry, where in _entries(cfg):
        step, lr = entry["step"], entry.get("lr")
        last = switches[-1].step if switches else 0
        if isinstance(step, bool) or not isinstance(step, int) or not last < step < cfg.train.steps:
            raise UserError(f"{where}.step={step!r}: must be an integer in {last + 1}..{cfg.train.steps - 1} (after "
                            f"{'the previous switch' if switches else 'step 0'} and before train.steps="
                            f"{cfg.train.steps}, so that some training follows it); e.g. "
                            f"{max(last + 1, cfg.train.steps * 3 // 4)}")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                               or lr <= 0):
            raise UserError(f"{where}.lr={lr!r}: must be a learning rate > 0, or left out to keep the optim "
                            "schedule's, e.g. 3.0e-4")
        switches.append(Switch(step, typed_section(entry["pe"], f"{where}.pe"), None if lr is None else float(lr)))
    return switches


def pe_at(cfg: Any, step: int, switches: list[Switch] | None = None) -> Any:
    """The `model.pe` in force at `step` (after that many updates); `switches`: `schedule(cfg)`, when read already."""
    found = [s.pe for s in (schedule(cfg) if switches is None else switches) if s.step <= step]
    return found[-1] if found else cfg.model.pe


def lr_override(cfg: Any, step: int, switches: list[Switch] | None = None) -> float | None:
    """The learning rate a schedule sets for the update at index `step` (None: the optim schedule's); `switches`:
    `schedule(cfg)`, when read already."""
    found = [s.lr for s in (schedule(cfg) if switches is None else switches) if s.step <= step and s.lr is not None]
    return found[-1] if found else None


def model_args_at(cfg: Any, step: int) -> Any:
    """The run's model arguments at `step`: `cfg.model` with the encoding then in force (a new object)."""
    return dataclasses.replace(cfg.model, pe=pe_at(cfg, step))


def _carried(pe: Any, shape: Any) -> int:
    """How many saved values (parameters, persistent buffers) pe's module holds, built at a short length."""
    import torch

    from trainer.model.position import build_position_encoding

    small = dataclasses.replace(shape, max_seq_len=min(shape.max_seq_len, 64))
    with torch.random.fork_rng():
        return sum(t.numel() for t in build_position_encoding(pe, small).state_dict().values())


def schedule_problems(cfg: Any) -> list[str]:
    """Every problem of train.pe_schedule (each naming the entry, the value and the fix); [] without one."""
    from trainer.model.position import encoding_problems

    if not cfg.train.pe_schedule:
        return []
    try:
        switches = schedule(cfg)
    except UserError as err:
        return [str(err)]
    if cfg.model.pe_layers:
        return ["train.pe_schedule with model.pe_layers: a schedule switches the encoding of every layer, and a "
                "hybrid stack has several; schedule a model whose layers share model.pe, or leave the schedule out"]
    shape = cfg.model.encoding_shape
    problems = [f"train.pe_schedule[{i}].pe: {p}" for i, s in enumerate(switches)
                for p in encoding_problems(s.pe, shape)]
    if problems:
        return problems
    before, where = cfg.model.pe, "model.pe"
    for i, s in enumerate(switches):
        for pe, named in ((before, where), (s.pe, f"train.pe_schedule[{i}].pe")):
            if held := _carried(pe, shape):
                problems.append(f"{named} (kind {pe.kind}) holds {held} trained values, which cannot carry over a "
                                f"switch of encoding at train.pe_schedule[{i}].step={s.step}; switch only between "
                                "encodings without parameters (RoPE, HD-RoPE with a fixed basis, NoPE, ALiBi, ...)")
        before, where = s.pe, f"train.pe_schedule[{i}].pe"
    return list(dict.fromkeys(problems))


def run_identity(cfg: Any) -> dict[str, Any]:
    """Which encoding a run trained with, as the identity columns: the model's (`stack_identity`) without a
    schedule, else pe_kind 'scheduled' labelled by each encoding and the step it starts, e.g. 'RoPE → NoPE at step
    900', with the first encoding's other columns."""
    from trainer.model.pe_layers import stack_identity
    from trainer.model.position import encoding_identity

    first = stack_identity(cfg.model)
    if not cfg.train.pe_schedule:
        return first
    label = first["pe_label"] + "".join(f" → {encoding_identity(s.pe)['pe_label']} at step {s.step}"
                                        + ("" if s.lr is None else f" (lr {s.lr:g})") for s in schedule(cfg))
    return {**first, "pe_kind": SCHEDULED_KIND, "pe_label": label}


def switch_encoding(model: Any, pe: Any) -> bool:
    """Give every layer of `model` (a Llama) the encoding `pe`, unless it has it already; whether it switched. The
    new module is built without drawing from the global random state, so a resumed run draws what a whole one does."""
    import torch

    from trainer.model.pe_layers import build_stack

    if model.args.pe == pe:
        return False
    args = dataclasses.replace(model.args, pe=pe)
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.pe = build_stack(args).to(device)
    model.args = args
    return True
