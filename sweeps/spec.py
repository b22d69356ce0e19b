"""The sweep spec: a YAML file validated against OmegaConf structured configs built from these dataclasses.

```yaml
name: quickstart                 # a plain name: letters, digits, . _ -
base: tiny                       # preset in experiments/ or a YAML path (relative to the spec)
overrides: {train.steps: 60}     # dotted keys applied to every cell
axes:                            # dotted keys -> lists; the grid is their product
  model.pe.rotation_dim: [2, 4]
  model.pe.basis: [identity, paley]
  seed: [42]                     # `seed` is short for train.seed
search: {kind: grid}             # or optuna with sampler, n_trials, metric, mode, space
scheduler: fifo                  # or asha (leaves holes in ablation tables)
resources: {cpus: 1, gpus: 0}    # or {workers: 2, cpus: 1, gpus_per_worker: 0, strategy: ddp}: Ray Train workers
max_concurrent: 0                # 0: as many as the cluster fits
max_failures: 1                  # retries of a failed trial, each from its last checkpoint
checkpoint_every: 0              # 0: keep the base config's train.ckpt_every
storage: runs/sweeps             # sweep directory = storage/name
tracking_uri: ""                 # "": sqlite:///<sweep dir>/mlflow.db
questions:                       # optional: the declared comparisons, the report's one Holm family
  - {variant: "4D Paley", reference: "RoPE", metric: val_loss_x4}
```
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hdrope.errors import UserError
from trainer.config import name_problem
from trainer.presets import refuse_interpolations

__all__ = ["ParamSpace", "Question", "Resources", "Search", "SpecError", "SweepSpec", "check_name", "load_spec"]

class SpecError(UserError):
    """An invalid spec: every problem, one per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


@dataclass
class ParamSpace:
    """One Optuna dimension: float/int in [low, high] (optionally log), or categorical choices."""

    type: str = "float"  # float | int | categorical
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    choices: list[Any] = field(default_factory=list)


@dataclass
class Search:
    """grid: every cell of the axes' product; optuna: n_trials sampled from `space` per grid cell."""

    kind: str = "grid"  # grid | optuna
    sampler: str = "tpe"  # tpe | random
    n_trials: int = 8
    metric: str = "val_loss"
    mode: str = "min"  # min | max
    space: dict[str, ParamSpace] = field(default_factory=dict)


@dataclass
class Resources:
    """Per-trial resources; fractional GPUs are allowed.

    workers = 1 trains in the trial's own process with `cpus` and `gpus`. workers = W > 1 makes the trial a Ray
    Train run of W data-parallel workers, each with `cpus` CPUs and `gpus_per_worker` GPUs, under `strategy` (a
    key of `trainer.run.distributed.STRATEGIES`); the trial's own process then only drives it and holds nothing."""

    cpus: float = 1.0
    gpus: float = 0.0
    workers: int = 1
    gpus_per_worker: float = 0.0
    strategy: str = "ddp"


@dataclass
class Question:
    """A declared comparison: `variant` − `reference` on `metric`, paired by seed; the report's declared questions
    are one Holm family (`analysis.questions`). Labels are the report's variant rows (e.g. "4D Paley", "RoPE")."""

    variant: str = ""
    reference: str = ""
    metric: str = ""


@dataclass
class SweepSpec:
    """A whole sweep."""

    name: str = ""
    base: str = "compact"
    overrides: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    search: Search = field(default_factory=Search)
    scheduler: str = "fifo"  # fifo | asha
    resources: Resources = field(default_factory=Resources)
    max_concurrent: int = 0
    max_failures: int = 1
    checkpoint_every: int = 0
    storage: str = "runs/sweeps"
    tracking_uri: str = ""
    dedup: bool = True
    description: str = ""
    questions: list[Question] = field(default_factory=list)


def check_name(value: str, what: str) -> None:
    """UserError unless value is a plain name that cannot escape its directory."""
    if (problem := name_problem(value, what)) is not None:
        raise UserError(problem)


def _question_shape(questions: Any) -> list[str]:
    """What is wrong with the shape of `questions:` (a list of {variant, reference, metric}), one line each."""
    if questions is None:
        return []
    fields = [f.name for f in dataclasses.fields(Question)]
    if not isinstance(questions, ListConfig):
        return [f"questions: must be a list of {{{', '.join(fields)}}} entries, got {type(questions).__name__}"]
    wrong = []
    for i, q in enumerate(questions):
        if not isinstance(q, DictConfig):
            wrong.append(f"questions[{i}]: must be a mapping {{{', '.join(fields)}}}, got {q!r}")
            continue
        wrong += [f"questions[{i}].{k}: not a question field; use {', '.join(fields)}" for k in q if k not in fields]
        wrong += [f"questions[{i}]: {k} is missing; give all of {', '.join(fields)}" for k in fields if not q.get(k)]
    return wrong


def load_spec(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Parse a spec file against the schema; SpecError (a UserError) names the bad key."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(str(path), [f"spec file {str(path)!r} does not exist"])
    try:
        raw = OmegaConf.load(path)
    except Exception as err:  # a damaged file: PyYAML raises Key/Index/Type/Attribute/ValueErrors for bad !!tags
        raise SpecError(str(path), [f"not valid YAML: {str(err).splitlines()[0]}"]) from None
    if not isinstance(raw, DictConfig) or not raw:
        raise SpecError(str(path), ["the spec is empty or not a YAML mapping; write at least `base:` and `axes:` "
                                    "(see sweeps/quickstart.yaml)"])
    dotlist = OmegaConf.from_dotlist(list(overrides or []))
    try:
        refuse_interpolations(raw, "spec")
        refuse_interpolations(dotlist, "--set")
    except UserError as err:
        raise SpecError(str(path), [str(err)]) from None
    sections = ("overrides", "axes", "search", "resources")
    wrong = [f"{key}: must be a mapping (key: value lines), got {type(raw[key]).__name__}"
             for key in sections if key in raw and not isinstance(raw[key], DictConfig)]
    wrong += _question_shape(raw.get("questions"))
    if wrong:
        raise SpecError(str(path), wrong)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SweepSpec), raw, dotlist)
        spec = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, TypeError) as err:  # TypeError: a list where a mapping belongs
        key = getattr(err, "full_key", None) or "?"
        fix = "remove it or check the spelling" if "not in" in str(err) else "give a value of the right type"
        raise SpecError(str(path), [f"{key}: {str(err).splitlines()[0]}; {fix}"]) from None
    assert isinstance(spec, SweepSpec)
    base = Path(spec.base)
    if base.suffix in (".yaml", ".yml") and not base.is_absolute() and not base.is_file():
        if (path.parent / base).is_file():
            spec.base = str(path.parent / base)
    if not spec.name:
        spec.name = path.stem
    return spec
