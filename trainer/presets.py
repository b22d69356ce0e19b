"""Model presets from `experiments/*.yaml`, merged into the `ModelArgs` structured config (OmegaConf).

A preset file has a top-level `model:` mapping. Overrides are dotted `key=value` strings
(`model.pe.rotation_dim=8`), parsed by OmegaConf as YAML scalars, never evaluated.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.model import ModelArgs, validate_model_args

__all__ = ["EXPERIMENTS_DIR", "available_presets", "load_model_args"]

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def available_presets() -> list[str]:
    """Preset names shipped in experiments/."""
    return sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))


def _preset_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ValueError(f"preset file {name_or_path!r} does not exist")
        return path
    if not _NAME.match(name_or_path) or ".." in name_or_path:
        raise ValueError(f"preset name {name_or_path!r} is not a plain name; use one of {available_presets()}")
    path = EXPERIMENTS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name_or_path!r}; choose one of {available_presets()} or a .yaml path")
    return path


def load_model_args(name_or_path: str, overrides: list[str] | None = None) -> ModelArgs:
    """Load a preset (name in experiments/ or a YAML path), apply overrides, validate, return ModelArgs."""
    path = _preset_path(name_or_path)
    raw = OmegaConf.load(path)
    extra = sorted(set(raw.keys()) - {"model"})
    if extra:
        raise ValueError(f"{path.name}: unknown top-level key(s) {extra}; a preset holds a 'model:' mapping")
    schema = OmegaConf.create({"model": OmegaConf.structured(ModelArgs)})
    try:
        merged = OmegaConf.merge(schema, raw, OmegaConf.from_dotlist(list(overrides or [])))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise ValueError(f"{path.name}: bad config key or value at {key!r}: {str(err).splitlines()[0]}") from None
    args = OmegaConf.to_object(merged)["model"]
    validate_model_args(args)
    return args
