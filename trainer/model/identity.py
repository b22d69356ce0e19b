"""The identity columns: which encoding a run used, as every artifact writes it (results, passkey table, dumps).

A leaf with no torch and no encoding, so a reader of stored identity rows (`hdrope sweep status`, `hdrope sweep
results`) types its table without loading the kind registry; `trainer.model.position` fills the rows.
"""

from __future__ import annotations

__all__ = ["IDENTITY_COLUMNS"]

# The identity row's columns and their types, as every artifact writes them (None: null).
IDENTITY_COLUMNS: dict[str, type] = {"pe_kind": str, "pe_label": str, "rotation_dim": int, "basis": str,
                                     "basis_seed": int, "theta": float, "scaling": str}
