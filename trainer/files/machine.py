"""The machine a run's numbers came from, as run.json records it and the results table and report read it.

Float kernels differ between CPUs (torch dispatches on the CPU's capability: AVX2, AVX-512, ...) and between GPUs and
torch versions, so the same seeds and config repeat a run to the last bit only on the same machine. This is not
config: it never enters the config hash. Reading the columns (`machine_row`) loads no torch.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["KERNEL_KEYS", "MACHINE_COLUMNS", "cpu_model", "machine_info", "machine_label", "machine_row"]

# what run.json's "machine" holds, and the results table's columns of it (None: not recorded)
MACHINE_COLUMNS: dict[str, type] = {"cpu_model": str, "cpu_capability": str, "gpu": str, "torch_version": str,
                                    "threads": int}
# the fields the float kernels depend on: runs that differ in one of them may differ in the last bits
KERNEL_KEYS = ("cpu_model", "cpu_capability", "gpu", "torch_version")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux: /proc/cpuinfo's first 'model name'), else what `platform` says."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:  # not Linux, or /proc not mounted: platform's answer below
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info(device: torch.device | None = None) -> dict[str, Any]:
    """This process's machine: CPU model, torch's CPU capability, the GPU's name when `device` is a CUDA device
    (else None), torch's version and its intra-op threads."""
    import torch

    gpu = torch.cuda.get_device_name(device) if device is not None and device.type == "cuda" else None
    return {"cpu_model": cpu_model(), "cpu_capability": str(torch.backends.cpu.get_cpu_capability()), "gpu": gpu,
            "torch_version": str(torch.__version__), "threads": int(torch.get_num_threads())}


def machine_label(machine: Mapping[str, Any]) -> str:
    """A machine as one phrase, e.g. 'AMD EPYC (CPU AVX2), torch 2.13.0+cpu, 1 thread'."""
    where = f"GPU {machine['gpu']}, " if machine.get("gpu") else ""
    threads = machine.get("threads")
    known = threads is not None and threads == threads  # a table's missing value is NaN
    count = f", {int(threads)} thread{'s' if int(threads) != 1 else ''}" if known else ""
    return (f"{where}{machine.get('cpu_model') or 'unknown CPU'} (CPU {machine.get('cpu_capability') or '?'}), "
            f"torch {machine.get('torch_version') or '?'}{count}")


def machine_row(machines: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The results table's machine columns of a run trained on `machines` (run.json's list, in order): each text
    field its distinct values joined by ' + ' (a run resumed on another machine shows both), threads the last;
    None where nothing was recorded."""
    row: dict[str, Any] = {}
    for key, kind in MACHINE_COLUMNS.items():
        values = list(dict.fromkeys(m.get(key) for m in machines if m.get(key) is not None))
        row[key] = (" + ".join(map(str, values)) or None) if kind is str else (int(values[-1]) if values else None)
    return row
