"""Checkpoints: safetensors weights, optimizer and RNG state (loaded with weights_only=True), and JSON state.

A checkpoint is a directory `step_XXXXXXXX/` with `model.safetensors`, `trainer_state.pt`,
`state.json` (step, loss history, python RNG, config hash) and `manifest.json` (sha256 of each
file). It is written into a temporary directory and renamed into place, so a crash never leaves
half a checkpoint under a final name; the manifest catches later truncation or corruption, and
every file is checked again as it is read (a file edited with a recomputed manifest), all before
any RNG is restored. A bad checkpoint is a UserError that names it, the file and the fix.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from hdrope.errors import UserError
from trainer.files.cache import sha256_file

__all__ = ["damaged_checkpoints", "latest_checkpoint", "list_checkpoints", "load_checkpoint", "read_state",
           "save_checkpoint"]

_FILES = ("model.safetensors", "trainer_state.pt", "state.json")
_PREFIX = "step_"
_FIX = "delete this checkpoint directory to resume from the previous one"
_STATE_LISTS = {"python_rng": 3, "numpy_rng": 4}  # state.json entries load_checkpoint restores, by length
_NUMPY_KEY_WORDS = 624  # MT19937 key length


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


def _step_dirs(root: Path, complete: bool) -> list[Path]:
    """step_* directories under root with (complete) or without a manifest.json, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and p.name.startswith(_PREFIX) and (p / "manifest.json").is_file() == complete]
    return sorted(found, key=lambda p: p.name)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under root, oldest first."""
    return _step_dirs(root, complete=True)


def damaged_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under root without a manifest.json, oldest first: damaged, since a checkpoint is
    renamed into place whole."""
    return _step_dirs(root, complete=False)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def _unreadable(path: Path, name: str, why: str) -> UserError:
    """The error for a checkpoint file that cannot be used."""
    return UserError(f"checkpoint {path}: {name} is unreadable ({why}); {_FIX}")


def _summary(err: Exception, width: int = 100) -> str:
    """The exception's type and the start of its message's first line."""
    first = (str(err).strip().splitlines() or ["no message"])[0]
    return f"{type(err).__name__}: {first[:width]}{'…' if len(first) > width else ''}"


def _verify(path: Path) -> None:
    """UserError unless every file is present and matches the manifest's sha256."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise UserError(f"checkpoint {path}: no manifest.json; not a checkpoint of this trainer, or cut short")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:  # JSONDecodeError or UnicodeDecodeError
        manifest = None
    if not isinstance(manifest, dict):
        raise UserError(f"checkpoint {path}: manifest.json is corrupt; {_FIX}")
    for name in _FILES:
        file = path / name
        if not file.is_file():
            raise UserError(f"checkpoint {path}: {name} is missing; {_FIX}")
        if sha256_file(file) != manifest.get(name):
            raise UserError(
                f"checkpoint {path}: {name} is truncated or corrupt (sha256 differs from the manifest); {_FIX}"
            )


def _read_trainer_state(path: Path, with_optimizer: bool) -> dict[str, Any]:
    """trainer_state.pt, loaded with weights_only=True, with its RNG (and optimizer) state checked."""
    name = "trainer_state.pt"
    try:
        blob = torch.load(path / name, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # garbage, or objects outside the weights-only allow-list
        raise _unreadable(path, name, "not a weights-only torch.save file") from None
    except EOFError:
        raise _unreadable(path, name, "empty or cut short") from None
    except (RuntimeError, ValueError) as err:  # a damaged zip archive
        raise _unreadable(path, name, _summary(err)) from None
    if not isinstance(blob, dict) or not _is_rng_state(blob.get("rng")):
        raise _unreadable(path, name, "no RNG state of this trainer")
    if with_optimizer and not isinstance(blob.get("optimizer"), dict):
        raise _unreadable(path, name, "no optimizer state")
    return blob


def _is_rng_state(rng: Any) -> bool:
    """Whether rng looks like what _rng_state saved: torch's byte state and numpy's MT19937 key."""
    return (isinstance(rng, dict) and isinstance(rng.get("torch"), torch.Tensor) and rng["torch"].dtype == torch.uint8
            and isinstance(rng.get("numpy"), torch.Tensor) and rng["numpy"].numel() == _NUMPY_KEY_WORDS)


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.json (step, config hash, RNG entries) checked, without loading weights."""
    path, name = Path(path), "state.json"
    try:
        state = json.loads((path / name).read_text())
    except OSError as err:
        raise _unreadable(path, name, type(err).__name__) from None
    except ValueError as err:  # JSONDecodeError or UnicodeDecodeError
        raise _unreadable(path, name, f"not JSON: {err}") from None
    if not isinstance(state, dict):
        raise _unreadable(path, name, f"not a JSON object: {str(state)[:60]!r}")
    bad = [] if isinstance(state.get("step"), int) else ["step"]
    bad += [key for key, n in _STATE_LISTS.items() if not isinstance(state.get(key), list) or len(state[key]) != n]
    if bad:
        raise _unreadable(path, name, f"missing or malformed {', '.join(bad)}")
    return state


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Verify and load a checkpoint into model (and optimizer), restore the RNGs, return state.json."""
    path = Path(path)
    _verify(path)
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    except (SafetensorError, RuntimeError, OSError) as err:  # RuntimeError: load_state_dict's shape mismatch
        raise UserError(f"checkpoint {path}: model.safetensors does not fit this model ({err})") from None
    if missing or unexpected:
        raise UserError(
            f"checkpoint {path}: weights do not match the configured model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); load it with the config it was trained with"
        )
    blob = _read_trainer_state(path, optimizer is not None)
    state = read_state(path)
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["rng"]["torch"])
    if "cuda" in blob["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["rng"]["cuda"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    kind, pos, has_gauss, cached = state["numpy_rng"]
    np.random.set_state((kind, blob["rng"]["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    return state

