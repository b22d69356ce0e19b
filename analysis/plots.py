"""Matplotlib figures for reports: every axis labelled with its unit, saved as PNG.

Figures are built as `matplotlib.figure.Figure` objects without pyplot, so importing this module
never changes the backend (notebooks keep rendering inline) and nothing opens a window."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["line_figure", "panel_figure", "polar_fan", "save"]


def save(fig, path: Path) -> Path:
    """Write fig as PNG (150 dpi) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:  # figures built with a layout engine (constrained) keep theirs
        fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")  # nothing cut off at the edges
    return path


def _bounded(band: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A band's (lo, hi) with unbounded ends (an exact interval over too few seeds is (−∞, ∞)) left undrawn."""
    lo, hi = (np.asarray(a, dtype=float) for a in band)
    keep = np.isfinite(lo) & np.isfinite(hi)
    return np.where(keep, lo, np.nan), np.where(keep, hi, np.nan)


def line_figure(series: dict[str, tuple[np.ndarray, np.ndarray]], xlabel: str, ylabel: str, title: str,
                logx: bool = False, logy: bool = False, band: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                hline: float | None = None, errorbars: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                caption: str | None = None):
    """One line per label (x, y), optional shaded bands or error bars (lo, hi), a horizontal reference line and a
    caption under the axes saying what the intervals are over."""
    fig = Figure(figsize=(6.4, 4.4 if caption else 4))
    ax = fig.subplots()
    for label, (x, y) in series.items():
        line, = ax.plot(x, y, marker="o" if len(x) < 20 else None, label=label)
        if band and label in band:
            ax.fill_between(x, *_bounded(band[label]), alpha=0.2, color=line.get_color())
        if errorbars and label in errorbars:
            lo, hi = (np.asarray(a, dtype=float) for a in errorbars[label])
            y = np.asarray(y, dtype=float)
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(np.asarray(x)[ok], y[ok], yerr=[y[ok] - lo[ok], hi[ok] - y[ok]], fmt="none", capsize=3,
                        color=line.get_color())
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if xlabel == "layer":
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _caption(fig, caption)
    return fig


def _caption(fig, caption: str | None) -> None:
    if caption:
        fig.text(0.01, -0.02, "\n".join(textwrap.wrap(caption, 110)), fontsize=7, va="top", ha="left")


def panel_figure(panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], xlabel: str, ylabel: str, title: str,
                 logx: bool = False, logy: bool = False,
                 bands: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] | None = None, caption: str | None = None):
    """Side-by-side panels (one per key), each one line per label (x, y) with an optional shaded band (lo, hi),
    sharing one legend, with a caption under them."""
    fig = Figure(figsize=(4.2 * len(panels), 4.4 if caption else 4))
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        for label, (x, y) in series.items():
            line, = ax.plot(x, y, label=label)
            band = (bands or {}).get(name, {}).get(label)
            if band is not None:
                ax.fill_between(x, *_bounded(band), alpha=0.2, color=line.get_color())
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        ax.set(xlabel=xlabel, title=name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    _caption(fig, caption)
    return fig


def polar_fan(table: pd.DataFrame, title: str, depth_bins: int = 5):
    """Passkey accuracy as a fan: radius = context length (tokens), angle = the key's realised relative depth
    (0 = start, 1 = end of the context, binned), each wedge labelled with its number of prompts; wedges no prompt
    landed in stay blank."""
    fig = Figure(figsize=(7, 6.4), layout="constrained")
    ax = fig.add_subplot(projection="polar")
    lengths = np.sort(table["target_length"].unique())
    edges = np.linspace(0.0, 1.0, depth_bins + 1)
    depth_bin = np.clip(np.digitize(table["depth"].astype(float), edges[1:-1]), 0, depth_bins - 1)
    grouped = table.assign(_bin=depth_bin).groupby(["target_length", "_bin"])["correct"]
    acc = grouped.mean().unstack().reindex(index=lengths, columns=range(depth_bins)).to_numpy(dtype=float)
    count = grouped.count().unstack().reindex(index=lengths, columns=range(depth_bins)).fillna(0).to_numpy(int)
    angle_edges = edges * np.pi / 2
    r_edges = np.concatenate([[0], lengths])
    mesh = ax.pcolormesh(angle_edges, r_edges, np.ma.masked_invalid(acc), cmap="viridis", vmin=0, vmax=1,
                         shading="flat")
    for i in range(len(lengths)):
        for j in range(depth_bins):
            if count[i, j]:
                r = (r_edges[i] + r_edges[i + 1]) / 2
                colour = "white" if acc[i, j] < 0.5 else "black"
                ax.text((angle_edges[j] + angle_edges[j + 1]) / 2, r, f"n={count[i, j]}", ha="center",
                        va="center", fontsize=6, color=colour)
    ax.set_thetamin(0)
    ax.set_thetamax(90)
    ax.set_thetagrids(np.degrees(angle_edges), [f"{e:g}" for e in edges])
    ax.set_rticks(lengths[:: max(1, len(lengths) // 4)])
    ax.tick_params(axis="y", labelsize=8)
    caption = ("radius: context length (tokens); angle: realised key depth (0 = start, 1 = end), "
               f"{depth_bins} bins; n = prompts per wedge, blank = none")
    ax.set_title("\n".join([*textwrap.wrap(title, 56), *textwrap.wrap(caption, 64)]), pad=18, fontsize=9)
    fig.colorbar(mesh, ax=ax, label="passkey accuracy (k/n)", shrink=0.6, pad=0.1)
    return fig
