"""`hdrope report NAME`: the paper's tables and figures from a finished sweep, as Markdown + PNG.

Writes <sweep dir>/report/report.md and report/*.png, and logs them to the sweep's MLflow parent
run. Cells are grouped into variants by every axis except the seeds (`analysis.variants`): a table
cell is mean ± 95% CI over seeds of one variant at one θ, never a pool of different settings. Every
variant that trained appears in every table and figure. Sections appear when their inputs exist:
ablation tables for every metric the runs produced, metric vs θ (when θ has two or more values),
passkey polar fans per variant, layer-wise effective rank and its difference to RoPE,
Fourier attention magnitudes at layers spread through depth, and the overhead table from
`bench_train.json` (`hdrope bench train --json > <sweep dir>/bench_train.json`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.fourier import fourier_magnitude, rope_band_magnitude
from analysis.load import load_passkey, load_profiles, load_results, load_stats, read_json, sweep_cells
from analysis.mechanism import mechanism_lines
from analysis.plots import line_figure, panel_figure, polar_fan, save
from analysis.rank import layerwise_rank, rank_difference
from analysis.stats import contrast_ci, excludes_zero, mean_ci
from analysis.theory import pair_frequencies
from analysis.variants import theta_text, trained, variant_axes
from hdrope.errors import UserError

__all__ = ["ablation_table", "build_report", "metric_columns", "references"]

_NOT_METRICS = {"seed", "steps", "theta", "rotation_dim", "basis_seed"}


def metric_columns(results: pd.DataFrame) -> list[str]:
    """The numeric metric columns the cells produced (in the results table's order), axes and ids excluded."""
    axes = set(results.attrs.get("axes", []))
    found = [c for c in results.columns if c not in _NOT_METRICS and c not in axes
             and pd.api.types.is_float_dtype(results[c]) and results[c].notna().any()]
    return sorted(found, key=lambda c: 0 if c.startswith("val_") else 1 if c.startswith("passkey") else 2)


def _theta_order(values: pd.Series) -> list[float]:
    finite = sorted({float(v) for v in values if v is not None and np.isfinite(v)})
    return finite + ([float("nan")] if values.isna().any() else [])


def _at_theta(cells: pd.DataFrame, theta: float) -> pd.DataFrame:
    return cells[cells["theta"].isna()] if np.isnan(theta) else cells[np.isclose(cells["theta"].astype(float), theta)]


def references(cells: pd.DataFrame) -> dict[str, str]:
    """variant -> the RoPE variant with the same other axes, which the tables test it against."""
    axes = variant_axes(cells)
    refs: dict[str, str] = {}
    for _, g in cells.groupby(axes, dropna=False) if axes else [(None, cells)]:
        two = g[_is_rope(g)].sort_values("variant_rank")
        if not two.empty:
            refs.update({v: two["variant"].iloc[0] for v in g["variant"].unique() if v != two["variant"].iloc[0]})
    return refs


def ablation_table(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows: variants (in identity order); columns: θ; cells 'mean ± half-CI (n)' over the seeds of that variant,
    marked * where the 95% CI of its difference to RoPE at that θ excludes 0."""
    df = trained(results)
    thetas = _theta_order(df["theta"])
    refs = references(df)
    out: dict[str, dict[str, str]] = {}
    for (variant, _), g in df.groupby(["variant", "variant_rank"], sort=False):
        for theta in thetas:
            at = _at_theta(g, theta)
            if at.empty:
                continue
            s = mean_ci(at[metric].to_numpy(dtype=float))
            text = f"{s['mean']:.4f}" if s["n"] < 2 else f"{s['mean']:.4f} ± {(s['hi'] - s['lo']) / 2:.4f} (n={s['n']})"
            if variant in refs:
                ref = _at_theta(df[df["variant"] == refs[variant]], theta)[metric].to_numpy(dtype=float)
                if excludes_zero(contrast_ci([at[metric].to_numpy(dtype=float), ref], [1.0, -1.0])):
                    text += " *"
            out.setdefault(variant, {})[theta_text(None if np.isnan(theta) else theta)] = text
    ranks = df.drop_duplicates("variant").set_index("variant")["variant_rank"]
    table = pd.DataFrame(out).T
    columns = [c for c in (theta_text(None if np.isnan(t) else t) for t in thetas) if c in table.columns]
    return table.loc[sorted(table.index, key=lambda v: ranks[v]), columns].fillna("")


def _markdown(table: pd.DataFrame) -> str:
    cols = ["variant", *table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in zip(table.index, table.values, strict=True):
        lines.append("| " + " | ".join([idx, *map(str, row)]) + " |")
    return "\n".join(lines)


def _table_notes(df: pd.DataFrame, metric: str) -> list[str]:
    """What a table cannot conclude: seeds per cell, and a metric that is zero everywhere."""
    notes = []
    counts = df.groupby(["variant", df["theta"].fillna(-1.0)])[metric].count()
    if counts.max() < 2:
        notes.append("_One seed per cell: no confidence intervals, so no difference here is tested._")
    elif refs := references(df):
        against = ", ".join(sorted(set(refs.values())))
        notes.append(f"_* differs from {against} at the same θ (95% bootstrap CI of the difference excludes 0); "
                     f"unmarked differences are not significant with {_seed_count(counts)} per cell (with few "
                     "seeds a bootstrap CI is rough: add seeds before concluding)._")
    values = df[metric].dropna()
    if len(values) and (values == 0).all():
        notes.append(f"_{metric} is 0 for every cell: no model solved the task at this training budget._")
    return notes


def _seed_count(counts: pd.Series) -> str:
    lo, hi = int(counts.min()), int(counts.max())
    return f"{lo} seeds" if lo == hi else f"{lo}–{hi} seeds"


def _by_theta(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(θ text, cells at that θ plus every θ-less variant such as NoPE) for each θ, or one group without θ."""
    thetas = [t for t in _theta_order(cells["theta"]) if not np.isnan(t)]
    free = cells[cells["theta"].isna()]
    if not thetas:
        return [("no θ", free)]
    return [(theta_text(t), pd.concat([cells[np.isclose(cells["theta"].astype(float), t)], free])) for t in thetas]


def _variants(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(v, g) for (v, _), g in cells.sort_values("variant_rank").groupby(["variant", "variant_rank"],
                                                                                sort=False)]


def _metric_vs_theta(cells: pd.DataFrame, out: Path, metric: str) -> Path | None:
    thetas = [t for t in _theta_order(cells["theta"]) if not np.isnan(t)]
    if len(thetas) < 2:
        return None
    series = {}
    for variant, g in _variants(cells):
        if g["theta"].isna().all():  # no θ (NoPE): a flat reference line across the θ range
            series[variant] = (np.array([thetas[0], thetas[-1]]), np.full(2, g[metric].mean()))
        else:
            agg = g.groupby("theta")[metric].mean()
            series[variant] = (agg.index.to_numpy(dtype=float), agg.to_numpy())
    fig = line_figure(series, "RoPE base θ", f"{metric} (nats/token)" if "loss" in metric else metric,
                      f"{metric} vs θ per variant (mean over seeds)", logx=True)
    return save(fig, out / f"{metric}_vs_theta.png")


def _stats(group: pd.DataFrame) -> pd.DataFrame:
    """The attention statistics of a variant's cells (seeds pooled)."""
    return pd.concat([load_stats(p) for p in group["attention_path"]], ignore_index=True)


def _is_rope(cells: pd.DataFrame) -> pd.Series:
    """Cells that are RoPE itself: kind rope, or hdrope at N = 2 (any basis: NOTES §1)."""
    return (cells["rotation_dim"] == 2) & cells["pe_kind"].isin(["rope", "hdrope"])


def _reference(variants: list[tuple[str, pd.DataFrame]]) -> tuple[str, pd.DataFrame] | None:
    """The RoPE variant the differences are taken against, if one ran."""
    rope = [(v, g) for v, g in variants if _is_rope(g).all()]
    return rope[0] if rope else None


def _rank_section(cells: pd.DataFrame, out: Path) -> tuple[list[Path], list[str]]:
    figs, notes = [], []
    have = cells[cells["attention_path"].map(lambda p: p.is_file())]
    for tt, group in _by_theta(have):
        variants = [(v, g, _stats(g)) for v, g in _variants(group)]
        if not variants:
            continue
        tag = tt.replace("θ=", "theta").replace(" ", "_")
        absolute = {v: (r["layer"].to_numpy(), r["mean"].to_numpy())
                    for v, _, st in variants if len(r := layerwise_rank(st))}
        bands = {v: (r["lo"].to_numpy(), r["hi"].to_numpy()) for v, _, st in variants if len(r := layerwise_rank(st))}
        figs.append(save(line_figure(absolute, "layer", "effective rank (Roy–Vetterli, σ)",
                                     f"effective attention rank per layer, {tt}", band=bands),
                         out / f"erank_{tag}.png"))
        ref = _reference([(v, g) for v, g, _ in variants])
        if ref is None:
            notes.append(f"{tt}: no RoPE variant ran, so no rank difference is shown")
            continue
        ref_stats = next(st for v, _, st in variants if v == ref[0])
        series, band = {}, {}
        for v, _, st in variants:
            if v == ref[0]:
                continue
            d = rank_difference(st, ref_stats)
            label = f"{v} − {ref[0]}"
            series[label] = (d["layer"].to_numpy(), d["diff"].to_numpy())
            band[label] = (d["lo"].to_numpy(), d["hi"].to_numpy())
            significant = ((d["lo"] > 0) | (d["hi"] < 0)).sum()
            notes.append(f"{tt}, {label}: mean Δerank over layers {d['diff'].mean():+.3f}; the 95% CI excludes 0 "
                         f"in {significant} of {len(d)} layers")
        if series:
            figs.append(save(line_figure(series, "layer", "Δ effective rank (Roy–Vetterli, σ)",
                                         f"effective rank difference, {tt}", band=band, hline=0.0),
                             out / f"erank_diff_{tag}.png"))
    return figs, notes


def _fourier_section(cells: pd.DataFrame, out: Path, head_dim: int) -> list[Path]:
    have = cells[cells["profile_path"].map(lambda p: p.is_file())]
    figs = []
    for tt, group in _by_theta(have):
        profiles = {v: pd.concat([load_profiles(p) for p in g["profile_path"]], ignore_index=True)
                    for v, g in _variants(group)}
        if not profiles:
            continue
        firsts = {v: g.iloc[0] for v, g in _variants(group)}
        n_layers = int(max(p["layer"].max() for p in profiles.values())) + 1
        layers = sorted({round(x) for x in np.linspace(0, n_layers - 1, min(3, n_layers))})
        bands = {v: np.unique(pair_frequencies(head_dim, int(c["rotation_dim"]), float(c["theta"])))
                 for v, c in firsts.items() if int(c["rotation_dim"]) >= 2 and np.isfinite(c["theta"])}
        all_freqs = np.unique(np.concatenate(list(bands.values()))) if bands else np.array([])
        uniform, band = {}, {}
        for layer in layers:
            u_series, b_series = {}, {}
            for v, prof in profiles.items():
                stack = np.stack(prof.loc[prof["layer"] == layer, "logit_mean"].to_list())
                freqs, mag = fourier_magnitude(stack)
                u_series[v] = (freqs[1:], mag.mean(0)[1:])
                f = bands.get(v, all_freqs)  # an encoding without frequencies is read at the others' θ_j
                if len(f):
                    b_series[v if v in bands else f"{v} (at the others' θ_j)"] = (f, rope_band_magnitude(stack, f)
                                                                                   .mean(0))
            uniform[f"layer {layer}"], band[f"layer {layer}"] = u_series, b_series
        tag = tt.replace("θ=", "theta").replace(" ", "_")
        figs.append(save(panel_figure(uniform, "frequency (rad/token)", "|rFFT(hann·(ℓ−mean))| (logit units)",
                                      f"Fourier attention magnitude, {tt}", logy=True), out / f"fourier_{tag}.png"))
        if any(band.values()):
            figs.append(save(panel_figure(band, "block frequency θ_j (rad/token)", "|NUDFT| (logit units)",
                                          f"RoPE-band magnitude, {tt}", logx=True, logy=True),
                             out / f"rope_band_{tag}.png"))
    return figs


def _log_to_mlflow(sweep_dir: Path, name: str, files: list[Path], tracking_uri: str | None) -> str | None:
    import mlflow

    uri = tracking_uri or f"sqlite:///{sweep_dir / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.sweep = '{name}' and tags.role = 'parent'")
    if not runs:
        return None
    for f in files:
        client.log_artifact(runs[0].info.run_id, str(f), artifact_path="report")
    return runs[0].info.run_id


def build_report(sweep_dir: str | Path, tracking_uri: str | None = None) -> Path:
    """Write report.md and its figures for a sweep directory; log them to its MLflow parent run."""
    sweep_dir = Path(sweep_dir)
    plan = read_json(sweep_dir / "plan.json")
    name = plan.get("name", sweep_dir.name)
    results = load_results(sweep_dir)
    cells = sweep_cells(sweep_dir)
    if cells.empty:
        raise UserError(f"{sweep_dir}: no cell finished; see `hdrope sweep status {name}`")
    out = sweep_dir / "report"
    out.mkdir(exist_ok=True)
    variants = list(dict.fromkeys(cells.sort_values("variant_rank")["variant"]))
    seed_axes = results.attrs.get("seed_axes", [])
    md = [f"# Sweep report: {name}", "",
          f"{len(results)} cells, {int((results['status'] == 'FINISHED').sum())} finished, "
          f"{int(results['dedup_of'].notna().sum())} answered by an equivalent cell (dedup). "
          f"{len(variants)} variants: {', '.join(variants)}. Averaged over: "
          f"{', '.join(seed_axes) or 'nothing (no seed axis)'}.", ""]
    figures: list[Path] = []
    md += ["## Ablation tables (mean ± 95% bootstrap half-CI over seeds, n = seeds)", ""]
    metrics = metric_columns(results)
    for metric in metrics:
        md += [f"### {metric}", "", _markdown(ablation_table(results, metric)), "", *_table_notes(cells, metric), ""]
    if mech := mechanism_lines(cells):
        md += ["## Optimiser mechanism: is the Paley − identity gap an optimiser effect? (NOTES §2)", "",
               "A fixed basis is a re-parameterisation of W_q/W_k: under a rotation-invariant optimiser (SGD) "
               "the two train identically (tests/test_mechanism.py), so a gap there would be noise.", "", *mech, ""]
    md += ["## Metric vs RoPE base θ", ""]
    shown = [m for m in ("val_loss", "val_loss_x4", "passkey_acc") if m in metrics]
    for metric in shown:
        if f := _metric_vs_theta(cells, out, metric):
            figures.append(f)
            md.append(f"![{metric} vs theta]({f.name})")
    if not any(f.name.endswith("_vs_theta.png") for f in figures):
        md.append("_θ takes fewer than two values in this sweep: no metric-vs-θ figure._")
    md.append("")
    try:
        pk = load_passkey(sweep_dir)
        md += ["## Passkey retrieval: polar fans (radius = context length, angle = key depth)", ""]
        for (variant, _), g in pk.sort_values("variant_rank").groupby(["variant", "variant_rank"], sort=False):
            slug = "".join(ch if ch.isalnum() else "_" for ch in variant)
            f = save(polar_fan(g, f"{variant}: passkey accuracy"), out / f"passkey_fan_{slug}.png")
            figures.append(f)
            md.append(f"![passkey {variant}]({f.name})")
        md.append("")
    except UserError as err:
        md += [f"_No passkey tables: {err}_", ""]
    rank_figs, notes = _rank_section(cells, out)
    if rank_figs:
        md += ["## Effective attention rank per layer (and its difference to RoPE, 95% CI)", "",
               *[f"- {n}" for n in notes], ""]
        md += [f"![{f.stem}]({f.name})" for f in rank_figs] + [""]
        figures += rank_figs
    fourier_figs = _fourier_section(cells, out, _head_dim(plan))
    if fourier_figs:
        md += ["## Fourier attention magnitudes (uniform rFFT and RoPE band)", ""]
        md += [f"![{f.stem}]({f.name})" for f in fourier_figs] + [""]
        figures += fourier_figs
    bench = read_json(sweep_dir / "bench_train.json")
    if bench.get("rows"):
        md += ["## Overhead (hdrope bench train)", "", "| variant | step ms | vs RoPE | tokens/s | MFU |",
               "|---|---|---|---|---|"]
        for r in bench["rows"]:
            md.append(f"| {r['variant']} | {r['step_ms']:.1f} | {r['vs_rope']:.3f}× | {r['tokens_per_s']:.0f} "
                      f"| {r['mfu']:.3f} |")
        md.append("")
    report = out / "report.md"
    report.write_text("\n".join(md))
    spec_uri = None
    if plan.get("spec"):
        from omegaconf import OmegaConf

        spec_uri = OmegaConf.to_container(OmegaConf.create(plan["spec"]), resolve=False).get("tracking_uri") or None
        if spec_uri and "${" in spec_uri:  # stored data, never resolved
            spec_uri = None
    _log_to_mlflow(sweep_dir, name, [report, *figures], tracking_uri or spec_uri)
    return report


def _head_dim(plan: dict) -> int:
    from omegaconf import OmegaConf

    for cell in plan.get("cells", {}).values():
        m = OmegaConf.create(cell["config"]).model
        return int(m.head_dim or m.dim // m.n_heads)
    return 64
