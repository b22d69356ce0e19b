"""Presets from `experiments/*.yaml`, merged into the `RunConfig` structured config (OmegaConf).

A preset file holds any of the RunConfig sections (`model:`, `data:`, `optim:`, `train:`, `eval:`,
`dump:`). Overrides are dotted `key=value` strings (`model.pe.rotation_dim=8`), parsed by OmegaConf
as YAML scalars, never evaluated. Presets, specs and overrides are data: an OmegaConf interpolation
(`${oc.env:SECRET}`, `${other.key}`) in any layer is refused, never resolved. Importing this module loads no
encoding and no torch: the kind registry loads when a config is merged (`merge_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hdrope.errors import UserError
from trainer.config import RunConfig, validate_config
from trainer.data.tokenizer import absolute_tokenizer
from trainer.model.args import ModelArgs

__all__ = [
    "EXPERIMENTS_DIR",
    "available_presets",
    "config_yaml",
    "load_config",
    "load_model_args",
    "merge_config",
    "override_layer",
    "preset_layer",
    "preset_path",
    "refuse_interpolations",
    "select_pe_kind",
    "yaml_layer",
]

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def available_presets() -> list[str]:
    """Preset names shipped in experiments/ (paper-table configs live in subfolders)."""
    return sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))


def preset_path(name_or_path: str) -> Path:
    """Resolve a preset name (experiments/NAME.yaml) or a YAML path; UserError when missing or unsafe."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UserError(f"preset file {name_or_path!r} does not exist")
        return path
    if not _NAME.match(name_or_path) or ".." in name_or_path:
        raise UserError(f"preset name {name_or_path!r} is not a plain name; use one of {available_presets()}")
    path = EXPERIMENTS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise UserError(f"unknown preset {name_or_path!r}; choose one of {available_presets()} or a .yaml path")
    return path


def override_layer(overrides: list[str]) -> DictConfig:
    """The OmegaConf layer of dotted key=value overrides; UserError names an item that is not key=value or
    whose value is not valid YAML."""
    for item in overrides:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise UserError(f"override {item!r} is not key=value; write e.g. model.pe.rotation_dim=8")
        try:
            OmegaConf.from_dotlist([item])
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or type(err).__name__
            raise UserError(f"override {item!r}: the value is not valid YAML ({problem}); close the brackets and "
                            "quotes, e.g. 'data.paths=[a.txt, b.txt]', or quote the value") from None
    return OmegaConf.from_dotlist(overrides)


def interpolations(node: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every string in node that OmegaConf would resolve (contains '${')."""
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in interpolations(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list):
        return [hit for i, v in enumerate(node) for hit in interpolations(v, f"{prefix}[{i}]")]
    return [(prefix, node)] if isinstance(node, str) and "${" in node else []


def refuse_interpolations(node: Any, where: str) -> None:
    """UserError naming every interpolation in a config layer: specs, presets and overrides are never resolved."""
    found = interpolations(node)
    if found:
        shown = ", ".join(f"{k}={v!r}" for k, v in found[:3])
        raise UserError(f"{where}: {shown} is an OmegaConf interpolation; specs, presets and overrides are data "
                        "and are never resolved (that could read environment variables): write the value itself")


@functools.cache
def _schema(kind: str) -> DictConfig:
    """The RunConfig schema with `model.pe` typed by kind's config class, built once per kind."""
    from trainer.model.position import pe_config_class

    cls = pe_config_class(kind)
    return OmegaConf.structured(RunConfig(model=ModelArgs(pe=cls(kind=kind))))


def select_pe_kind(layers: list, where: str = "config") -> tuple[str, list]:
    """The `model.pe.kind` the layers select (the last one that sets it wins; default hdrope), and the layers
    with every `model.pe` setting of an earlier layer dropped where a later layer switches to a kind with
    another config class (`tiny model.pe.kind=fope` must not inherit the preset's `rotation_dim`)."""
    from trainer.model.position import POSITION_ENCODINGS, PEConfig, pe_config_class

    kind: Any = PEConfig.kind
    cls: type = PEConfig
    out: list = []
    for layer in layers:
        node = OmegaConf.create(layer) if isinstance(layer, dict) else layer
        found = None
        if isinstance(node, DictConfig):
            found = OmegaConf.select(node, "model.pe.kind", default=None, throw_on_missing=False)
        if found is not None:
            if not isinstance(found, str):
                raise UserError(f"{where}: model.pe.kind={found!r} must be a name, one of {sorted(POSITION_ENCODINGS)}")
            try:
                new_cls = pe_config_class(found)
            except UserError as err:
                raise UserError(f"{where}: {err}") from None
            if new_cls is not cls:
                out = [_without_pe(earlier) for earlier in out]
            kind, cls = found, new_cls
        out.append(node)
    return kind, out


def _refuse_unlisted(layer: Any, key: str, example: str, where: str) -> None:
    """UserError naming `key` when the layer sets it to something other than a list (OmegaConf's own error names no
    key for that)."""
    node = OmegaConf.create(layer) if isinstance(layer, dict) else layer
    found = OmegaConf.select(node, key, default=None) if isinstance(node, DictConfig) else None
    if found is not None and not isinstance(found, ListConfig):
        shown = OmegaConf.to_container(found) if isinstance(found, DictConfig) else found
        raise UserError(f"{where}: {key}={shown!r}: must be a list, e.g. {key}=[{example}]")


def _without_pe(node: Any) -> Any:
    if not isinstance(node, DictConfig) or OmegaConf.select(node, "model.pe", default=None) is None:
        return node
    node = copy.deepcopy(node)
    del node.model["pe"]
    return node


def _pe_key_hint(key: str, kind: str) -> str:
    from trainer.model.position import pe_config_class

    if not key.startswith("model.pe."):
        return ""
    fields = [f.name for f in dataclasses.fields(pe_config_class(kind))]
    if key.split(".")[2] in fields:  # the kind has the key: its value is what is wrong
        return ""
    return (f"; model.pe.kind={kind!r} has the keys {fields} (each kind has its own settings: put kind-specific "
            "keys in the cells of that kind, not on a grid axis crossed with other kinds)")


def merge_config(layers: list, where: str = "config") -> RunConfig:
    """Merge OmegaConf layers (dicts/DictConfigs) onto the RunConfig schema; UserError names the bad key.

    `model.pe` is typed by the config class of the kind the layers select (its module under trainer.model.encodings),
    so a key the kind does not have is an error naming it. Switching to a kind with another config class
    drops the `model.pe` settings of the layers before the switch (see `select_pe_kind`). A tokenizer.json
    path is made absolute here, against the current directory, so a run reads one file wherever it resumes."""
    for layer in layers:
        refuse_interpolations(layer, where)
        for key, example in (("model.pe_layers", "{layers: 'every 4th', pe: {kind: nope}}"),
                             ("train.pe_schedule", "{step: 900, pe: {kind: nope}}")):
            _refuse_unlisted(layer, key, example, where)
    kind, layers = select_pe_kind(layers, where)
    schema = _schema(kind)
    try:
        merged = OmegaConf.merge(schema, *layers)
        cfg = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, TypeError) as err:  # TypeError: a list where a mapping belongs
        key = getattr(err, "full_key", None) or "?"
        raise UserError(f"{where}: bad config key or value at {key!r}: {str(err).splitlines()[0]}"
                        f"{_pe_key_hint(str(key), kind)}") from None
    assert isinstance(cfg, RunConfig)
    cfg.data.tokenizer = absolute_tokenizer(cfg.data.tokenizer)
    return cfg


def config_yaml(cfg: RunConfig) -> str:
    """A run config as the YAML a run directory and a plan store (what `merge_config` reads back)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def yaml_layer(path: Path, fix: str = "fix the file"):
    """The raw OmegaConf node of a YAML file; UserError naming the file when it is not valid YAML (or not text)."""
    try:
        return OmegaConf.load(path)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid YAML: {str(err).splitlines()[0]}; {fix}") from None


def preset_layer(name_or_path: str):
    """The raw OmegaConf mapping of a preset file (not yet merged onto the schema)."""
    return yaml_layer(preset_path(name_or_path))


def load_config(name_or_path: str, overrides: list[str] | None = None, validate: bool = True) -> RunConfig:
    """Load a preset (name in experiments/ or a YAML path), apply key=value overrides, validate, return it."""
    overrides = list(overrides or [])
    layer = override_layer(overrides)
    raw = preset_layer(name_or_path)
    cfg = merge_config([raw, layer], where=Path(name_or_path).name)
    if validate:
        validate_config(cfg)
    return cfg


def load_model_args(name_or_path: str, overrides: list[str] | None = None) -> ModelArgs:
    """The validated `model` section of a preset."""
    return load_config(name_or_path, overrides).model
