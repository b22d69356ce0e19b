"""Short readable labels of config values: the one place a sweep's axis value becomes text.

Sweep cell ids, MLflow run names and the report's variant rows all show an axis value through
`value_label`, so a mapping value reads the same everywhere: `{name: adamw}` is `AdamW`,
`{name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.0}` is `SGD(lr=0.1, m=0.9, wd=0)`, and
`{rope_type: yarn, factor: 4}` is `yarn(factor=4)`. Scalars read as they are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["value_label"]

HEAD_KEYS = ("name", "kind", "rope_type", "type")  # the key of a mapping that names what it is
DISPLAY_NAMES = {"adamw": "AdamW", "sgd": "SGD", "adafactor": "Adafactor"}  # trainer.run.optim.OPTIMIZERS, as written
SHORT_KEYS = {"momentum": "m", "weight_decay": "wd", "warmup_steps": "warmup", "rotation_dim": "N"}


def _number(value: float) -> str:
    """A float in its shortest form that still reads back as the same number (0.1, 1e-05, 4)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def value_label(value: Any) -> str:
    """The label of a config value: a mapping as `Head(key=value, ...)` (its name or kind first, in its display
    form, the other keys shortened), a list as `[a, b]`, a float in its shortest exact form, anything else as str."""
    if isinstance(value, Mapping):
        head_key = next((k for k in HEAD_KEYS if isinstance(value.get(k), str)), None)
        head = DISPLAY_NAMES.get(str(value[head_key]), str(value[head_key])) if head_key else ""
        args = ", ".join(f"{SHORT_KEYS.get(str(k), k)}={value_label(v)}" for k, v in value.items() if k != head_key)
        return f"{head}({args})" if head and args else head or args
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_label(v) for v in value) + "]"
    if isinstance(value, float):
        return _number(value)
    return str(value)
