"""Variants: the cells of a sweep grouped by every axis except the seeds (what a report averages over).

A variant is the encoding label (`pe_label`, from `trainer.model.position.encoding_identity`) plus the
value of every other axis that is not a seed, not θ (θ is a table column and an x axis) and not
already said by the label (the encoding registry's identity keys: kind, rotation dim, basis, ...).
Names are built from values and never parsed back; order comes from the identity columns. The axes and
seed axes are read from the metadata that `hdrope sweep results` writes into results.parquet.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from trainer.labels import value_label
from trainer.model.position import identity_keys

__all__ = ["THETA_KEY", "theta_text", "trained", "value_text", "variant_axes", "with_variants"]

THETA_KEY = "model.pe.theta"


def variant_axes(results: pd.DataFrame) -> list[str]:
    """The axis columns that split variants: every axis but seeds, θ and the keys the label already says."""
    axes = results.attrs.get("axes", [])
    seeds = set(results.attrs.get("seed_axes", []))
    said = identity_keys()  # what pe_label already says
    return [k for k in axes if k not in seeds and k != THETA_KEY and k not in said and k in results
            and not _node_said_by_label(results, k, said)]


def _node_said_by_label(results: pd.DataFrame, key: str, said: tuple[str, ...]) -> bool:
    """Whether an axis over a whole config node that holds identity keys (`model.pe` as a list of encodings) adds
    nothing to the label: within every (pe_label, θ) its value is one. Otherwise it stays a variant axis, so that
    two encodings with one label (differing in a setting the label does not say) are never merged."""
    if not any(s.startswith(key + ".") for s in said):
        return False
    theta = results["theta"].astype(float).fillna(-1.0) if "theta" in results else 0.0
    groups = results.assign(_theta=theta).groupby(["pe_label", "_theta"])[key]
    return bool(groups.nunique(dropna=False).max() <= 1) if len(results) else True


def value_text(value: object) -> str:
    """An axis value as a label: a mapping (stored as JSON) by its `trainer.labels.value_label`, as in the sweep's
    cell ids and run names (e.g. 'SGD(lr=0.1, m=0.9, wd=0)'); anything else as str."""
    text = str(value)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:  # a plain value, not a mapping stored as JSON
        parsed = None
    return value_label(parsed) if isinstance(parsed, dict) else text


def _short(key: str, value: object) -> str:
    return f"{key.rsplit('.', 1)[-1]}={value_text(value)}"


def with_variants(results: pd.DataFrame) -> pd.DataFrame:
    """results plus `variant` (display name) and `variant_rank` (a stable order from the identity columns)."""
    df = results.copy()
    axes = variant_axes(results)
    df["variant"] = [
        ", ".join([str(r["pe_label"]), *(_short(k, r[k]) for k in axes)]) for _, r in df.iterrows()
    ] if len(df) else []
    keys = df[["rotation_dim", "basis", "pe_kind", *axes, "variant"]].astype(str) if len(df) else df
    order = sorted({tuple(row) for row in keys.itertuples(index=False)},
                   key=lambda t: (int(t[0]) if t[0].lstrip("-").isdigit() else 0, *t[1:]))
    rank = {t[-1]: i for i, t in enumerate(order)}
    df["variant_rank"] = df["variant"].map(rank) if len(df) else []
    df.attrs = dict(results.attrs)
    return df


def trained(results: pd.DataFrame) -> pd.DataFrame:
    """Finished cells that trained themselves (dedup copies dropped), with their variants."""
    df = results[(results["status"] == "FINISHED") & results["dedup_of"].isna()]
    df.attrs = dict(results.attrs)
    return with_variants(df)


def theta_text(theta: float | None) -> str:
    """'θ=1e+04' for a base, 'no θ' for encodings without one (NoPE)."""
    return "no θ" if theta is None or not np.isfinite(theta) else f"θ={theta:g}"
