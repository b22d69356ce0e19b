"""The report's figures, built from stored cells and returned unsaved, each with a caption saying what it
averages and what its intervals are over (the seed is the unit, as in the tables).

Every builder returns a list of `Figure` records; `hdrope report` saves them, notebook (c) shows them
without writing anything.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.comparisons import is_rope
from analysis.fourier import fourier_magnitude, rope_band_magnitude
from analysis.lengthgen import LEARNED_THRESHOLD, accuracy_counts, position_losses, task_metrics
from analysis.load import load_profiles, load_stats, same_dump_form
from analysis.outcomes import read_passkey, seed_values
from analysis.plots import line_figure, panel_figure, polar_fan
from analysis.rank import per_seed, rank_difference, seed_interval
from analysis.stats import compare, mean_interval, proportion_interval
from analysis.theory import pair_frequencies
from analysis.variants import theta_text

__all__ = ["Figure", "accuracy_vs_length", "by_theta", "fourier_figures", "metric_vs_theta", "passkey_fans",
           "position_loss_figures", "rank_figures", "variants"]


@dataclass
class Figure:
    """A report figure: file stem, the matplotlib figure, its caption, notes for the text and its alt text."""

    stem: str
    figure: object
    caption: str
    notes: tuple[str, ...] = ()
    alt: str = ""

    def __post_init__(self) -> None:
        self.alt = self.alt or self.stem.replace("_", " ")

    def png(self) -> bytes:
        """The figure as PNG bytes (for notebooks: `IPython.display.Image(fig.png())`)."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        return buffer.getvalue()


def _tag(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in text.replace("θ=", "theta"))


def variants(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(variant, its cells) in identity order."""
    return [(v, g) for (v, _), g in cells.sort_values("variant_rank").groupby(["variant", "variant_rank"],
                                                                                sort=False)]


def by_theta(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(θ text, cells at that θ plus every θ-less variant such as NoPE) for each θ, or one group without θ."""
    thetas = sorted({float(t) for t in cells["theta"].dropna()})
    free = cells[cells["theta"].isna()]
    if not thetas:
        return [("no θ", free)]
    return [(theta_text(t), pd.concat([cells[np.isclose(cells["theta"].astype(float), t)], free])) for t in thetas]


def metric_vs_theta(cells: pd.DataFrame, metric: str, level: float = 0.95) -> list[Figure]:
    """The metric against θ per variant: the mean over seeds with its t-interval as error bars (none when θ takes
    fewer than two values)."""
    values = seed_values(cells, metric)
    thetas = sorted({float(t) for t in values["theta"].dropna()})
    if len(thetas) < 2:
        return []
    series, bars, seeds = {}, {}, set()
    for variant, g in values.sort_values("variant_rank").groupby("variant", sort=False):
        if g["theta"].isna().all():  # no θ (NoPE): a flat reference line across the θ range
            iv = mean_interval(g["value"], level)
            series[variant] = (np.array([thetas[0], thetas[-1]]), np.full(2, iv.estimate))
            bars[variant] = (np.full(2, iv.lo), np.full(2, iv.hi))
            seeds.add(iv.n)
            continue
        ivs = [(t, mean_interval(gt["value"], level)) for t, gt in g.groupby("theta", sort=True)]
        series[variant] = (np.array([t for t, _ in ivs]), np.array([iv.estimate for _, iv in ivs]))
        bars[variant] = (np.array([iv.lo for _, iv in ivs]), np.array([iv.hi for _, iv in ivs]))
        seeds |= {iv.n for _, iv in ivs}
    unit = "k/n per seed" if "k" in values else "one value per seed"
    caption = (f"Points: mean over seeds ({unit}; n = {'–'.join(map(str, sorted(seeds)))} seeds per point); "
               f"error bars: {level:.0%} Student-t interval over seeds (none with one seed). Differences inside "
               "the bars are not established; the tables give the tests.")
    fig = line_figure(series, "RoPE base θ", f"{metric} (nats/token)" if "loss" in metric else metric,
                      f"{metric} vs θ per variant", logx=True, errorbars=bars, caption=caption)
    return [Figure(f"{metric}_vs_theta", fig, caption)]


def passkey_fans(cells: pd.DataFrame) -> list[Figure]:
    """One polar fan per (variant, θ) over its seeds' prompts, with n per wedge and the realised depths."""
    figs = []
    have = cells[cells["passkey_path"].map(lambda p: p.is_file())]
    order = have.assign(_t=have["theta"].astype(float).fillna(-1.0)).sort_values(["variant_rank", "_t"])
    for (variant, theta), g in order.groupby(["variant", "_t"], sort=False):
        tt = theta_text(None if theta < 0 else theta)
        table = pd.concat([read_passkey(p) for p in g["passkey_path"]], ignore_index=True)
        k, n = int(table["correct"].sum()), len(table)
        seeds = g["seed"].nunique()
        title = f"{variant}, {tt}: passkey accuracy {k}/{n} ({seeds} seed{'s' * (seeds != 1)} pooled)"
        caption = f"{variant} at {tt}: the prompts of its {seeds} seed(s) in one fan ({n} prompts, {k} correct)."
        figs.append(Figure(f"passkey_fan_{_tag(variant)}_{_tag(tt)}", polar_fan(table, title), caption,
                           alt=f"passkey {variant}, {tt}"))
    return figs


def _seeded_stats(g: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([load_stats(p).assign(seed=s) for p, s in zip(g["attention_path"], g["seed"], strict=True)],
                     ignore_index=True)


def rank_figures(cells: pd.DataFrame, level: float = 0.95) -> list[Figure]:
    """Per θ: layer-wise effective rank per variant and its difference to RoPE, intervals over seeds (each seed
    averaged over its heads × probe samples first), differences paired by seed and Holm-corrected over layers."""
    figs = []
    have = cells[cells["attention_path"].map(lambda p: p.is_file())]
    for tt, group in by_theta(have):
        stats = {v: _seeded_stats(g) for v, g in variants(group)}
        if stats:  # a pooled map's effective rank is not a full map's: one form and length per comparison
            same_dump_form(pd.concat(stats.values(), ignore_index=True), f"the effective-rank figures at {tt}")
        seeded = {v: per_seed(s) for v, s in stats.items()}
        if not seeded:
            continue
        absolute, bands = {}, {}
        for v, s in seeded.items():
            iv = seed_interval(s, level=level)
            absolute[v] = (iv["layer"].to_numpy(), iv["mean"].to_numpy())
            bands[v] = (iv["lo"].to_numpy(), iv["hi"].to_numpy())
        n_seeds = sorted({int(s["seed"].nunique()) for s in seeded.values()})
        pooled = (f"Each seed's value per layer is the mean over its heads × probe samples; lines: mean over seeds "
                  f"(n = {'–'.join(map(str, n_seeds))}); bands: {level:.0%} Student-t interval over seeds (none "
                  "with one seed).")
        figs.append(Figure(f"erank_{_tag(tt)}", line_figure(
            absolute, "layer", "effective rank (Roy–Vetterli, σ)", f"effective attention rank per layer, {tt}",
            band=bands, caption=pooled), pooled))
        ref = next((v for v, g in variants(group) if is_rope(g).all()), None)
        if ref is None:
            figs[-1].notes = (f"{tt}: no RoPE variant ran, so no rank difference is shown",)
            continue
        series, band, notes = {}, {}, []
        for v, s in seeded.items():
            if v == ref:
                continue
            d = rank_difference(s, seeded[ref], level=level)
            label = f"{v} − {ref}"
            series[label] = (d["layer"].to_numpy(), d["diff"].to_numpy())
            band[label] = (d["lo"].to_numpy(), d["hi"].to_numpy())
            if not d["testable"].any():
                shown = "too few seeds to test any layer"
            else:
                shown = (f"different from 0 (Holm over {len(d)} layers, {'paired' if d['paired'].all() else 'Welch'})"
                         f" in {int((d['testable'] & (d['p_adj'] < 1 - level)).sum())} of {len(d)} layers")
            notes.append(f"{tt}, {label}: mean Δerank over layers {d['diff'].mean():+.3f}; {shown}")
        if series:
            caption = (f"{pooled.replace('lines: mean over seeds', 'lines: mean per-seed difference')} Differences "
                       "are paired by seed where both variants ran the same seeds (else Welch).")
            figs.append(Figure(f"erank_diff_{_tag(tt)}", line_figure(
                series, "layer", "Δ effective rank (Roy–Vetterli, σ)", f"effective rank difference, {tt}",
                band=band, hline=0.0, caption=caption), caption, tuple(notes)))
    return figs


def _spectra(g: pd.DataFrame, layer: int, freqs: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(rFFT frequencies, per seed: (uniform spectrum, band magnitudes at freqs)) of the layer, each averaged over
    heads (and over the cells of that seed)."""
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    grid = np.array([])
    for path, seed in zip(g["profile_path"], g["seed"], strict=True):
        stack = np.stack(load_profiles(path, layers=[layer])["logit_mean"].to_list())
        grid, mag = fourier_magnitude(stack)
        band = rope_band_magnitude(stack, freqs).mean(0) if len(freqs) else np.array([])
        out.setdefault(int(seed), []).append((mag.mean(0), band))
    return grid, [(np.mean([u for u, _ in v], axis=0), np.mean([b for _, b in v], axis=0)) for v in out.values()]


def _over_seeds(arrays: list[np.ndarray], level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    stack = np.stack(arrays)
    ivs = [mean_interval(stack[:, i], level) for i in range(stack.shape[1])]
    return (np.array([iv.estimate for iv in ivs]), np.array([iv.lo for iv in ivs]), np.array([iv.hi for iv in ivs]))


def fourier_figures(cells: pd.DataFrame, head_dim: int, level: float = 0.95) -> list[Figure]:
    """Per θ, at up to three layers spread through depth: the uniform Fourier magnitude of the logit-by-distance
    profile and its magnitude at each variant's block frequencies, mean over seeds with t-interval bands."""
    figs = []
    have = cells[cells["profile_path"].map(lambda p: p.is_file())]
    for tt, group in by_theta(have):
        vs = variants(group)
        if not vs:
            continue
        n_layers = int(max(load_profiles(g["profile_path"].iloc[0])["layer"].max() for _, g in vs)) + 1
        layers = sorted({round(x) for x in np.linspace(0, n_layers - 1, min(3, n_layers))})
        bands = {v: np.unique(pair_frequencies(head_dim, int(g["rotation_dim"].iloc[0]), float(g["theta"].iloc[0])))
                 for v, g in vs if int(g["rotation_dim"].iloc[0]) >= 2 and np.isfinite(g["theta"].iloc[0])}
        all_freqs = np.unique(np.concatenate(list(bands.values()))) if bands else np.array([])
        uniform, u_band, rope, r_band = {}, {}, {}, {}
        seeds = set()
        for layer in layers:
            key = f"layer {layer}"
            uniform[key], u_band[key], rope[key], r_band[key] = {}, {}, {}, {}
            for v, g in vs:
                f = bands.get(v, all_freqs)  # an encoding without frequencies is read at the others' θ_j
                freqs, per_seed_spectra = _spectra(g, layer, f)
                seeds.add(len(per_seed_spectra))
                mean, lo, hi = _over_seeds([u for u, _ in per_seed_spectra], level)
                uniform[key][v], u_band[key][v] = (freqs[1:], mean[1:]), (lo[1:], hi[1:])
                if len(f):
                    label = v if v in bands else f"{v} (at the others' θ_j)"
                    mean, lo, hi = _over_seeds([b for _, b in per_seed_spectra], level)
                    rope[key][label], r_band[key][label] = (f, mean), (lo, hi)
        caption = (f"Each seed's spectrum is the mean over its heads of |rFFT(hann·(ℓ−mean ℓ))| of the mean "
                   f"logit by distance ℓ(Δ); lines: mean over seeds (n = {'–'.join(map(str, sorted(seeds)))}); "
                   f"bands: {level:.0%} Student-t interval over seeds (none with one seed).")
        figs.append(Figure(f"fourier_{_tag(tt)}", panel_figure(
            uniform, "frequency (rad/token)", "|rFFT(hann·(ℓ−mean))| (logit units)",
            f"Fourier attention magnitude, {tt}", logy=True, bands=u_band, caption=caption), caption))
        if any(rope.values()):
            cap = caption.replace("|rFFT(hann·(ℓ−mean ℓ))|", "the non-uniform DFT magnitude at the block frequencies")
            figs.append(Figure(f"rope_band_{_tag(tt)}", panel_figure(
                rope, "block frequency θ_j (rad/token)", "|NUDFT| (logit units)", f"RoPE-band magnitude, {tt}",
                logx=True, logy=True, bands=r_band, caption=cap), cap))
    return figs


def accuracy_vs_length(cells: pd.DataFrame, level: float = 0.95, threshold: float = LEARNED_THRESHOLD) -> list[Figure]:
    """Per task and θ: exact match against the evaluated length per variant, k/n pooled over seeds and prompts with
    Wilson bands; a variant below the learned threshold at 1x is labelled "not learned"."""
    figs = []
    for task, by_factor in task_metrics(list(cells.columns)).items():
        for tt, group in by_theta(cells):
            series, band, seeds = {}, {}, set()
            for v, g in variants(group):
                ivs = [(f, proportion_interval(*accuracy_counts(g, m), level)) for f, m in by_factor.items()]
                ivs = [(f, iv) for f, iv in ivs if iv.n > 0]
                if not ivs:
                    continue
                k, n = accuracy_counts(g, by_factor[min(by_factor)])  # the learned_table rule: the shortest factor
                label = v if n and k / n >= threshold else f"{v} (not learned)"
                series[label] = (np.array([f for f, _ in ivs]), np.array([iv.estimate for _, iv in ivs]))
                band[label] = (np.array([iv.lo for _, iv in ivs]), np.array([iv.hi for _, iv in ivs]))
                seeds.add(int(g["seed"].nunique()))
            if not series:
                continue
            caption = (f"Points: exact match k/n pooled over each variant's seeds (n = "
                       f"{'–'.join(map(str, sorted(seeds)))}) and prompts (identical across variants within a seed); "
                       f"bands: {level:.0%} Wilson interval of k/n. \"not learned\": 1x accuracy below {threshold:g}, "
                       "so its lengths carry no verdict. The length tables give the tests.")
            figs.append(Figure(f"accuracy_vs_length_{_tag(task)}_{_tag(tt)}", line_figure(
                series, "evaluated length (× train length)", "exact match (k/n)", f"{task}: accuracy vs length, {tt}",
                logx=True, band=band, caption=caption), caption))
    return figs


def _seed_curves(rows: pd.DataFrame, g: pd.DataFrame) -> pd.DataFrame:
    """seed × bin position -> loss of one variant's cells (cells sharing a seed averaged)."""
    mine = rows[rows["cell"].isin(g.index)].assign(seed=lambda d: d["cell"].map(g["seed"]))
    return mine.groupby(["seed", "position"])["loss"].mean().unstack("position").sort_index()


def position_loss_figures(cells: pd.DataFrame, level: float = 0.95) -> list[Figure]:
    """Per θ, at the longest evaluated length: the per-position loss per variant (mean over seeds, t-bands) and its
    difference from RoPE per bin (paired by seed where both ran the same seeds, else Welch), positions in
    multiples of the train length."""
    rows = position_losses(cells)
    if rows.empty:
        return []
    factor = float(rows["length_factor"].max())
    rows = rows[rows["length_factor"] == factor]
    train_length = int(rows["length"].iloc[0]) / factor
    figs = []
    for tt, group in by_theta(cells[cells.index.isin(rows["cell"])]):
        curves = {v: _seed_curves(rows, g) for v, g in variants(group)}
        if not curves:
            continue
        absolute, bands = {}, {}
        for v, c in curves.items():
            ivs = [mean_interval(c[p], level) for p in c.columns]
            absolute[v] = (c.columns.to_numpy() / train_length, np.array([iv.estimate for iv in ivs]))
            bands[v] = (np.array([iv.lo for iv in ivs]), np.array([iv.hi for iv in ivs]))
        n_seeds = "–".join(map(str, sorted({len(c) for c in curves.values()})))
        pooled = (f"Windows of {factor:g}x the train length; each bin's loss is the mean over its tokens (bins by "
                  f"first position); lines: mean over seeds (n = {n_seeds}); bands: {level:.0%} Student-t interval "
                  "over seeds (none with one seed). Positions past 1 are beyond the train length.")
        figs.append(Figure(f"position_loss_{_tag(tt)}", line_figure(
            absolute, "position (× train length)", "next-token loss (nats/token)",
            f"loss by position at {factor:g}x, {tt}", band=bands, caption=pooled), pooled))
        ref = next((v for v, g in variants(group) if is_rope(g).all()), None)
        if ref is None:
            figs[-1].notes = (f"{tt}: no RoPE variant ran, so no loss-by-position difference is shown",)
            continue
        series, band = {}, {}
        for v, c in curves.items():
            if v == ref:
                continue
            r = curves[ref]
            paired = set(c.index) == set(r.index)
            cs = [compare(c[p].to_numpy(), r.loc[c.index if paired else r.index, p].to_numpy(), paired=paired,
                          level=level) for p in c.columns if p in r.columns]
            x = np.array([p for p in c.columns if p in r.columns]) / train_length
            series[f"{v} − {ref}"] = (x, np.array([d.delta for d in cs]))
            band[f"{v} − {ref}"] = (np.array([d.lo for d in cs]), np.array([d.hi for d in cs]))
        if series:
            caption = (f"{pooled.replace('lines: mean over seeds', 'lines: mean per-seed difference')} Differences "
                       "are paired by seed where both variants ran the same seeds (else Welch); bands are per bin, "
                       "not corrected over bins.")
            figs.append(Figure(f"position_loss_diff_{_tag(tt)}", line_figure(
                series, "position (× train length)", "Δ next-token loss (nats/token)",
                f"loss by position minus {ref}, {factor:g}x, {tt}", band=band, hline=0.0, caption=caption), caption))
    return figs
