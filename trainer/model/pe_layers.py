"""`model.pe_layers`: a position encoding per layer, the hybrid stacks of SmolLM3 (NoPE every 4th layer), Llama 4
(NoPE layers interleaved with RoPE ones) and RNoPE-SWA / SWAN-GPT (NoPE global layers beside RoPE local ones, with
`model.layer_pattern`).

Two forms, both a list:

- exceptions to `model.pe`: entries `{layers: SELECTION, pe: SECTION}`, each giving the layers it names the
  `model.pe` section SECTION instead (a later entry wins over an earlier one); every other layer takes `model.pe`.
  SELECTION is a layer index (0-based; negative counts from the last layer), a list of them, or `'every Nth'` (the
  Nth, 2Nth, … layer counting from 1, SmolLM3's and Llama 4's NoPE interval: indices N-1, 2N-1, …), whose N must
  divide model.n_layers.
- explicit: one `model.pe` section per layer, exactly model.n_layers of them.

A section is a whole `model.pe` of its kind: it starts from that kind's defaults, never from `model.pe`. Any registered
kinds may be mixed: each layer's attention is its own kind's on its own path. Layers whose sections are equal share
one module, built for as many layers as they are.

`layer_sections` reads the list without torch; `stack_groups` types the sections through the encoding registry and
gives each distinct encoding its layers and shape, from which the model, its identity (`stack_identity`: one variant,
pe_kind `hybrid`, labelled by what each layer takes), its dedup canonical form and its cost are all derived.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hdrope.errors import UserError

if TYPE_CHECKING:
    from trainer.model.encodings.base import EncodingShape, PositionModule


class ModelArgs(Protocol):
    """What these functions read of `trainer.model.args.ModelArgs` (which imports this module to check itself)."""

    pe: Any
    pe_layers: Any
    n_layers: int

    @property
    def encoding_shape(self) -> EncodingShape: ...

    @property
    def layer_windows(self) -> list[int]: ...

__all__ = ["HYBRID_KIND", "StackGroup", "build_stack", "every_nth", "layer_configs", "layer_heads", "layer_sections",
           "layers_text", "pe_section", "stack_dedup", "stack_groups", "stack_identity", "stack_problems",
           "typed_section", "windows_text"]

HYBRID_KIND = "hybrid"  # the identity's pe_kind of a model whose layers take more than one encoding
_EVERY = re.compile(r"^\s*every\s+(\d+)\s*(?:st|nd|rd|th)?(?:\s+layer)?\s*$", re.IGNORECASE)
_EXAMPLE = "e.g. model.pe_layers=[{layers: 'every 4th', pe: {kind: nope}}]"


def every_nth(n: int, n_layers: int) -> list[int]:
    """The 0-based indices of the Nth, 2Nth, … layer of n_layers (counting from 1)."""
    return [i for i in range(n_layers) if (i + 1) % n == 0]


def _selection(value: Any, n_layers: int, where: str) -> list[int]:
    """The layers an entry's `layers` names, sorted; UserError naming the field, the value and the fix."""
    if isinstance(value, str):
        found = _EVERY.match(value)
        if found is None or int(found.group(1)) < 1:
            raise UserError(f"{where}={value!r}: write a layer index, a list of them, or 'every Nth' (N >= 1), "
                            f"{_EXAMPLE}")
        n = int(found.group(1))
        if n_layers % n:
            raise UserError(f"{where}={value!r}: {n} does not divide model.n_layers={n_layers}, so the pattern would "
                            f"be cut at the last layers; choose a depth that is a multiple of {n}, or list the layers "
                            f"(e.g. {every_nth(n, n_layers) or [n_layers - 1]})")
        return every_nth(n, n_layers)
    items = list(value) if isinstance(value, Sequence) else [value]
    if not items:
        raise UserError(f"{where}=[]: names no layer; list layer indices, e.g. [3], or write 'every 4th'")
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not -n_layers <= item < n_layers:
            raise UserError(f"{where}={value!r}: {item!r} is not a layer of a model of model.n_layers={n_layers}; "
                            f"use indices 0..{n_layers - 1} (or -1 for the last)")
        out.append(item % n_layers)
    if len(set(out)) != len(out):
        raise UserError(f"{where}={value!r}: names a layer twice; list each layer once")
    return sorted(out)


def _plain(value: Any) -> Any:
    """A config value as plain data (OmegaConf containers and dataclasses made dicts and lists)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=False)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _is_section(entry: Any) -> bool:
    return isinstance(entry, Mapping) and "kind" in entry


def layer_sections(pe_layers: Any, n_layers: int) -> list[tuple[Any, str] | None]:
    """Each layer's `model.pe` section with the field that gave it (None: the layer takes `model.pe`), read from
    `model.pe_layers` without building or typing anything; UserError naming the field, the value and the fix."""
    entries = _plain(pe_layers)
    if entries is None or entries == []:
        return [None] * n_layers
    if not isinstance(entries, list):
        raise UserError(f"model.pe_layers={entries!r}: must be a list, of {{layers, pe}} entries or of one model.pe "
                        f"section per layer, {_EXAMPLE}")
    if all(_is_section(e) for e in entries):
        if len(entries) != n_layers:
            raise UserError(f"model.pe_layers: a list of {len(entries)} model.pe sections for model.n_layers="
                            f"{n_layers}; give one section per layer, or entries {{layers, pe}} for the layers that "
                            f"differ from model.pe, {_EXAMPLE}")
        return [(e, f"model.pe_layers[{i}]") for i, e in enumerate(entries)]
    out: list[tuple[Any, str] | None] = [None] * n_layers
    for i, entry in enumerate(entries):
        where = f"model.pe_layers[{i}]"
        if _is_section(entry):
            raise UserError(f"{where}: a model.pe section among {{layers, pe}} entries; write it as "
                            f"{{layers: [...], pe: {json.dumps(entry)}}}, or give one section per layer")
        if not isinstance(entry, Mapping) or set(entry) != {"layers", "pe"}:
            keys = sorted(entry) if isinstance(entry, Mapping) else entry
            raise UserError(f"{where}={keys!r}: an entry has exactly the keys layers and pe, {_EXAMPLE}")
        for layer in _selection(entry["layers"], n_layers, f"{where}.layers"):
            out[layer] = (entry["pe"], f"{where}.pe")
    return out


def pe_section(pe: Any) -> dict[str, Any]:
    """A typed `model.pe` config as the plain section `model.pe_layers` holds."""
    return dict(_plain(pe))


def typed_section(section: Any, where: str) -> Any:
    """A `model.pe` section (`where` names it) as its kind's typed config (at that kind's defaults where unset);
    UserError naming the key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from trainer.model.position import POSITION_ENCODINGS, pe_config_class

    if not isinstance(section, Mapping) or not isinstance(section.get("kind"), str):
        raise UserError(f"{where}={section!r}: must be a model.pe section with a kind, e.g. {{kind: nope}}; one of "
                        f"{sorted(POSITION_ENCODINGS)}")
    kind = section["kind"]
    try:
        cls = pe_config_class(kind)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls(kind=kind)), dict(section)))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        fields = [f.name for f in dataclasses.fields(cls)]
        raise UserError(f"{where}: bad key or value at {key!r}: {str(err).splitlines()[0]}; kind {kind!r} has the "
                        f"keys {fields}") from None


def layer_configs(a: ModelArgs) -> list[Any]:
    """Each layer's typed `model.pe` config (`model.pe` itself where `model.pe_layers` names nothing)."""
    return [a.pe if s is None else typed_section(*s) for s in layer_sections(a.pe_layers, a.n_layers)]


def _key(pe: Any) -> str:
    return json.dumps(pe_section(pe), sort_keys=True, default=str)


@dataclass(frozen=True)
class StackGroup:
    """One distinct encoding of a model: its typed config, the layers that take it and the shape it is built for
    (its n_layers: how many they are)."""

    pe: Any
    layers: tuple[int, ...]
    shape: EncodingShape


def stack_groups(a: ModelArgs) -> list[StackGroup]:
    """The model's distinct encodings, in the order of their first layer (one group: every layer alike)."""
    configs = layer_configs(a)
    found: dict[str, list[int]] = {}
    for i, pe in enumerate(configs):
        found.setdefault(_key(pe), []).append(i)
    base = a.encoding_shape
    return [StackGroup(configs[layers[0]], tuple(layers), dataclasses.replace(base, n_layers=len(layers)))
            for layers in found.values()]


def layers_text(layers: Sequence[int], n_layers: int) -> str:
    """Which layers, as a label reads them: 'every 4th', 'at layer 3' or 'at layers 0, 5'."""
    n = layers[0] + 1
    if len(layers) > 1 and n > 1 and list(layers) == every_nth(n, n_layers):  # 'every 1st' is every layer
        return f"every {n}{'nd' if n == 2 else 'rd' if n == 3 else 'th'}"
    return f"at layer{'s' if len(layers) > 1 else ''} {', '.join(str(i) for i in layers)}"


def _main(groups: list[StackGroup]) -> int:
    """The group that names a hybrid: the most layers, then the earliest."""
    return max(range(len(groups)), key=lambda i: (len(groups[i].layers), -groups[i].layers[0]))


def windows_text(windows: Sequence[int]) -> str:
    """The sliding windows of a model's layers as a label reads them ('' when no layer has one), e.g. ', window 16
    at layers 0, 1, 2' (RNoPE-SWA's local RoPE layers) or ', window 16' when every layer has it."""
    found: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        if w:
            found.setdefault(int(w), []).append(i)
    return "".join(f", window {w}" + ("" if len(layers) == len(windows) else f" {layers_text(layers, len(windows))}")
                   for w, layers in found.items())


def stack_identity(a: ModelArgs) -> dict[str, Any]:
    """Which encoding the model uses, as the identity columns (`trainer.model.position.IDENTITY_COLUMNS`): its
    kind's when every layer takes one encoding, else pe_kind 'hybrid', labelled by the encoding of most layers and
    where each other one stands (e.g. '4D Paley + NoPE every 4th'), with that main encoding's other columns. Sliding
    windows (`model.window`, `model.layer_pattern`) are part of the label: they decide which positions a layer sees."""
    from trainer.model.position import encoding_identity

    groups = stack_groups(a)
    rows = [encoding_identity(g.pe) for g in groups]
    windows = windows_text(a.layer_windows)
    if len(groups) == 1:
        return {**rows[0], "pe_label": rows[0]["pe_label"] + windows} if windows else rows[0]
    main = _main(groups)
    label = rows[main]["pe_label"] + "".join(f" + {rows[i]['pe_label']} {layers_text(g.layers, a.n_layers)}"
                                             for i, g in enumerate(groups) if i != main)
    return {**rows[main], "pe_kind": HYBRID_KIND, "pe_label": label + windows}


def stack_dedup(a: ModelArgs) -> tuple[Any, list[dict[str, Any]]]:
    """The canonical (`model.pe`, `model.pe_layers`) of the model's equivalence class: each layer's encoding
    canonical (`trainer.model.position.dedup_pe`); one encoding for every layer is that encoding and no list, else
    `model.pe` is the main encoding and the list gives every layer's."""
    from trainer.model.position import dedup_pe

    per_layer = [dedup_pe(pe) for pe in layer_configs(a)]
    keys = [_key(pe) for pe in per_layer]
    if len(set(keys)) == 1:
        return per_layer[0], []
    main = max(keys, key=lambda k: (keys.count(k), -keys.index(k)))
    return copy.deepcopy(per_layer[keys.index(main)]), [pe_section(pe) for pe in per_layer]


def layer_heads(a: Any) -> list[tuple[int, int, int]]:
    """Each layer's (query heads projected, KV heads projected, attention heads), as its encoding says
    (`trainer.model.position.attention_heads`: RoPE++ doubles the attention heads or halves the projections)."""
    from trainer.model.position import attention_heads

    return [attention_heads(pe, a.n_heads, a.n_kv_heads) for pe in layer_configs(a)]


def stack_problems(a: ModelArgs) -> list[str]:
    """Every problem of the model's encodings, found without building: `model.pe_layers` itself, then each distinct
    encoding's at the shape it is built for (named by its layers in a hybrid)."""
    from trainer.model.position import encoding_problems

    if not a.pe_layers:  # every layer takes model.pe: its own problems, as they name it (not a mapping, a bad kind)
        return encoding_problems(a.pe, a.encoding_shape)
    try:
        groups = stack_groups(a)
    except UserError as err:
        return [str(err)]
    if len(groups) == 1:
        return encoding_problems(groups[0].pe, a.encoding_shape)
    return _whole_model_problems(groups) + [f"{p} (model.pe_layers: layers {', '.join(str(i) for i in g.layers)})"
            for g in groups for p in encoding_problems(g.pe, g.shape)]


def _whole_model_problems(groups: list[StackGroup]) -> list[str]:
    """A kind that must take every layer (`EncodingKind.whole_model`) in a stack of several encodings."""
    from trainer.model.position import POSITION_ENCODINGS

    found = []
    for g in groups:
        why = getattr(POSITION_ENCODINGS.get(getattr(g.pe, "kind", None)), "whole_model", "")
        if why:
            others = sorted({o.pe.kind for o in groups if o is not g} - {g.pe.kind})
            layers = ", ".join(str(i) for i in g.layers)
            found.append(f"model.pe_layers: layers {layers} take {g.pe.kind}, which cannot share a model with "
                         f"{', '.join(others)}: {why}; give every layer {g.pe.kind}, or none" if others else
                         f"model.pe_layers: layers {layers} take {g.pe.kind} with other settings than the rest: "
                         f"{why}; give every layer the same {g.pe.kind} settings")
    return found


def build_stack(a: ModelArgs) -> PositionModule:
    """The model's position-encoding module: its kind's, built for every layer, when all layers take one encoding;
    else a `LayeredEncoding` of one module per distinct encoding, each built for its own layers."""
    from trainer.model.encodings.layered import LayeredEncoding
    from trainer.model.position import build_position_encoding

    groups = stack_groups(a)
    if len(groups) == 1:
        return build_position_encoding(groups[0].pe, a.encoding_shape)
    return LayeredEncoding([build_position_encoding(g.pe, g.shape) for g in groups], [g.layers for g in groups])
