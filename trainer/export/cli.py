"""`hdrope export CHECKPOINT OUT_DIR`: a trained run as a standard Hugging Face LlamaForCausalLM."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["export_main"]


def export_main(argv: list[str]) -> int:
    """`hdrope export CHECKPOINT OUT_DIR`: the run as a standard HF LlamaForCausalLM computing the same logits."""
    p = argparse.ArgumentParser(prog="hdrope export", description=export_main.__doc__)
    p.add_argument("checkpoint", help="a checkpoint directory inside a run (…/checkpoints/step_N)")
    p.add_argument("out_dir", help="a new or empty directory")
    a = p.parse_args(argv)
    from trainer.export.hf_export import export_checkpoint

    print(export_checkpoint(Path(a.checkpoint), Path(a.out_dir)))
    return 0
