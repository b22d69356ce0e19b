"""Checkpoints: safetensors weights, optimizer and RNG state (loaded with weights_only=True), and JSON state.

A checkpoint is a directory `step_XXXXXXXX/` with `model.safetensors`, `trainer_state.pt`,
`state.json` (step, loss history, python RNG, config hash) and `manifest.json` (sha256 of each
file). It is written into a temporary directory and renamed into place, so a crash never leaves
half a checkpoint under a final name; the manifest catches later truncation or corruption.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from torch import nn

from hdrope.errors import UserError
from trainer.cache import sha256_file

__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint", "read_state", "save_checkpoint"]

_FILES = ("model.safetensors", "trainer_state.pt", "state.json")
_PREFIX = "step_"


def _rng_state(np_state: tuple) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(np_state[1].astype(np.int64))}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(
    root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], keep_last: int
) -> Path:
    """Write the checkpoint of `step` under root atomically, prune to the newest keep_last, return its path."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        np_state = np.random.get_state()
        torch.save({"optimizer": optimizer.state_dict(), "rng": _rng_state(np_state)}, tmp / "trainer_state.pt")
        py_state = random.getstate()
        full = {
            **state,
            "step": step,
            "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
            "numpy_rng": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        }
        (tmp / "state.json").write_text(json.dumps(full))
        manifest = {name: sha256_file(tmp / name) for name in _FILES}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under root, oldest first."""
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and (p / "manifest.json").is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def _verify(path: Path) -> None:
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"checkpoint {path}: no manifest.json; not a checkpoint of this trainer, or cut short")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"checkpoint {path}: manifest.json is corrupt; delete the checkpoint directory") from None
    for name in _FILES:
        file = path / name
        if not file.is_file():
            raise UserError(f"checkpoint {path}: {name} is missing; delete the checkpoint to resume from an older one")
        if sha256_file(file) != manifest.get(name):
            raise UserError(
                f"checkpoint {path}: {name} is truncated or corrupt (sha256 differs from the manifest); "
                "delete this checkpoint directory to resume from the previous one"
            )


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Verify and load a checkpoint into model (and optimizer), restore the RNGs, return state.json."""
    path = Path(path)
    _verify(path)
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    except Exception as err:
        raise UserError(f"checkpoint {path}: model.safetensors does not fit this model ({err})") from None
    if missing or unexpected:
        raise UserError(
            f"checkpoint {path}: weights do not match the configured model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); load it with the config it was trained with"
        )
    blob = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["rng"]["torch"])
    if "cuda" in blob["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["rng"]["cuda"])
    state = json.loads((path / "state.json").read_text())
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    kind, pos, has_gauss, cached = state["numpy_rng"]
    np.random.set_state((kind, blob["rng"]["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    return state


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.json (step, config hash, ...) without loading weights; UserError when unreadable."""
    file = Path(path) / "state.json"
    try:
        state = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"checkpoint {path}: state.json is unreadable ({type(err).__name__}); "
                        "delete this checkpoint directory to resume from the previous one") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UserError(f"checkpoint {path}: state.json has no step; "
                        "delete this checkpoint directory to resume from the previous one")
    return state
