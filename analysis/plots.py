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


def line_figure(series: dict[str, tuple[np.ndarray, np.ndarray]], xlabel: str, ylabel: str, title: str,
                logx: bool = False, logy: bool = False, band: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                hline: float | None = None):
    """One line per label (x, y), optional shaded bands (lo, hi) and a horizontal reference line."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o" if len(x) < 20 else None, label=label)
        if band and label in band:
            ax.fill_between(x, band[label][0], band[label][1], alpha=0.2)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if xlabel == "layer":
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def panel_figure(panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], xlabel: str, ylabel: str, title: str,
                 logx: bool = False, logy: bool = False):
    """Side-by-side panels (one per key), each one line per label (x, y), sharing one legend."""
    fig = Figure(figsize=(4.2 * len(panels), 4))
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        for label, (x, y) in series.items():
            ax.plot(x, y, label=label)
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        ax.set(xlabel=xlabel, title=name)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    return fig


def polar_fan(table: pd.DataFrame, title: str):
    """Passkey accuracy as a fan: radius = context length (tokens), angle = relative key depth (0..1 over 90°)."""
    fig = Figure(figsize=(7, 6), layout="constrained")
    ax = fig.add_subplot(projection="polar")
    lengths = np.sort(table["target_length"].unique())
    depths = np.sort(table["depth_target"].unique())
    acc = table.pivot_table(index="target_length", columns="depth_target", values="correct", aggfunc="mean")
    acc = acc.reindex(index=lengths, columns=depths).to_numpy(dtype=float)
    angle_edges = np.linspace(0, np.pi / 2, len(depths) + 1)
    r_edges = np.concatenate([[0], lengths])
    mesh = ax.pcolormesh(angle_edges, r_edges, acc, cmap="viridis", vmin=0, vmax=1, shading="flat")
    ax.set_thetamin(0)
    ax.set_thetamax(90)
    ax.set_thetagrids([0, 22.5, 45, 67.5, 90], ["0", "0.25", "0.5", "0.75", "1"])
    ax.set_rticks(lengths[:: max(1, len(lengths) // 4)])
    ax.tick_params(axis="y", labelsize=8)
    caption = "radius: context length (tokens); angle: relative key depth (0 = start, 1 = end)"
    ax.set_title("\n".join([*textwrap.wrap(title, 48), caption]), pad=18, fontsize=10)
    fig.colorbar(mesh, ax=ax, label="passkey accuracy", shrink=0.6, pad=0.1)
    return fig
