"""`model.layer_pattern`: which layers attend within a sliding window (local) and which see every earlier token
(global), as a repeating pattern such as "3 local, 1 global" (Gemma 3 and Qwen 3's local/global mix); its parts may
also be separated by ':' (quoted in YAML, where an unquoted "a : b" is a mapping), '/' or '+'.

The pattern repeats from the first layer and is cut at the model's depth. Loads no torch.
"""

from __future__ import annotations

import re

from hdrope.errors import UserError

__all__ = ["KINDS", "layer_windows", "parse_layer_pattern"]

KINDS = ("local", "global")
_PART = re.compile(r"^\s*(\d+)\s*(local|global)\s*$")
_SEPARATORS = re.compile(r"[,:/+]")
_EXAMPLE = "e.g. model.layer_pattern='3 local, 1 global'"


def parse_layer_pattern(pattern: str) -> list[str]:
    """The pattern's repeating unit, one entry ('local' or 'global') per layer; UserError naming the field."""
    unit: list[str] = []
    if not isinstance(pattern, str):
        raise UserError(f"model.layer_pattern={pattern!r}: must be text such as '3 local, 1 global' (in YAML, quote a "
                        "pattern written with ':')")
    for part in _SEPARATORS.split(pattern):
        found = _PART.match(part)
        if found is None or int(found.group(1)) < 1:
            raise UserError(f"model.layer_pattern={pattern!r}: {part.strip()!r} is not 'N local' or 'N global' with "
                            f"N >= 1; give parts such as these separated by commas, {_EXAMPLE}")
        unit += [found.group(2)] * int(found.group(1))
    return unit


def layer_windows(pattern: str, window: int, n_layers: int) -> list[int]:
    """Each layer's window (0: global) for `model.window` and `model.layer_pattern` (empty: every layer local when a
    window is set, else every layer global); UserError when the pattern names local layers and no window is set."""
    if not pattern:
        return [int(window)] * n_layers
    unit = parse_layer_pattern(pattern)
    if "local" in unit and not window:
        raise UserError(f"model.layer_pattern={pattern!r} has local layers but model.window is 0; set "
                        "model.window to their window in tokens, e.g. model.window=128")
    return [int(window) if unit[i % len(unit)] == "local" else 0 for i in range(n_layers)]
