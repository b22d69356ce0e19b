"""Validated argument types of the `hdrope bench` commands: one home for what a count, a share, a size or an
output file may be.

Each is an argparse `type=`: a bad value is refused while the command line is parsed, before any work, and
argparse names the flag ("argument --rounds: ...") and exits 2.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

__all__ = ["non_negative_int", "positive_float", "positive_int", "probability", "writable_file"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # int() of text that is no whole number
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:  # float() of text that is no number
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number")
    return value


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (rounds, steps, a batch, a tensor dimension)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number ≥ 1")
    return value


def non_negative_int(text: str) -> int:
    """A whole number ≥ 0 (a thread count where 0 keeps torch's default)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number ≥ 0 (0: torch's default)")
    return value


def probability(text: str) -> float:
    """A finite share in [0, 1]."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a share in [0, 1]")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a size, a time budget)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number > 0")
    return value


def writable_file(text: str) -> str:
    """A file path the command can create or replace: its folder exists and is writable, and it is no folder."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; name a file, e.g. {path / 'bench.json'}")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {str(folder)!r} does not exist; create it first "
                                         "(mkdir -p) or write elsewhere")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write there; choose a writable path")
    return text
