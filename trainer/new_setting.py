"""`NEW_SETTING`: the field metadata of a config setting added after runs were stored.

At its default such a setting stays out of the config hash, so every stored run keeps its hash (and resumes) while a
run that sets it gets a new one. Use as `field(default=..., metadata=NEW_SETTING)` in any config dataclass, an
encoding's or a task's included; `trainer.config.config_hash` reads it.
"""

from __future__ import annotations

__all__ = ["NEW_SETTING"]

NEW_SETTING = {"hash": "omit_at_default"}
