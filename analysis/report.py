"""`hdrope report NAME`: the paper's tables and figures from a finished sweep, as Markdown + PNG.

Writes <sweep dir>/report/report.md and report/*.png, and logs them to the sweep's MLflow parent
run. Sections appear when their inputs exist: the ablation table (rotation × basis × θ, mean ± 95%
CI over seeds), metric vs θ per rotation dim, passkey polar fans per rotation dim, the effective-rank
difference per layer against 2D RoPE, Fourier attention magnitudes at layers spread through depth,
and the overhead table from `bench_train.json` (`hdrope bench train --json > <sweep dir>/bench_train.json`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.fourier import fourier_magnitude, rope_band_magnitude
from analysis.load import load_passkey, load_profiles, load_results, load_stats, read_json, sweep_cells
from analysis.plots import line_figure, polar_fan, save
from analysis.rank import rank_difference
from analysis.stats import mean_ci
from analysis.theory import pair_frequencies
from hdrope.errors import UserError

__all__ = ["ablation_table", "build_report"]

METRICS = ("val_loss", "val_bpb", "val_loss_x2", "val_loss_x4", "val_loss_x8", "passkey_acc")


def _variant(row) -> str:
    return "2D RoPE" if int(row["rotation_dim"]) == 2 else f"{int(row['rotation_dim'])}D {row['basis']}"


def ablation_table(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows: variant (rotation dim × basis, 2D merged); columns: θ; cells 'mean ± half-CI' over seeds."""
    df = results[results["status"] == "FINISHED"].copy()
    df = df[df["dedup_of"].isna()] if "dedup_of" in df else df
    df["variant"] = df.apply(_variant, axis=1)
    out: dict[str, dict[str, str]] = {}
    for (variant, theta), g in df.groupby(["variant", "theta"]):
        s = mean_ci(g[metric].to_numpy(dtype=float))
        cell = f"{s['mean']:.4f}" if s["n"] < 2 else f"{s['mean']:.4f} ± {(s['hi'] - s['lo']) / 2:.4f}"
        out.setdefault(variant, {})[f"θ={theta:g}"] = cell
    table = pd.DataFrame(out).T
    order = sorted(table.index, key=lambda v: (int(v.split("D")[0]), v))
    return table.loc[order, sorted(table.columns, key=lambda c: float(c[2:]))]


def _markdown(table: pd.DataFrame) -> str:
    cols = ["variant", *table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in zip(table.index, table.values, strict=True):
        lines.append("| " + " | ".join([idx, *map(str, row)]) + " |")
    return "\n".join(lines)


def _pick(cells: pd.DataFrame, n: int, theta: float) -> pd.Series | None:
    """The first trained cell with rotation dim n at θ (Paley preferred for N > 2)."""
    c = cells[(cells["rotation_dim"] == n) & np.isclose(cells["theta"], theta)]
    if n > 2 and (c["basis"] == "paley").any():
        c = c[c["basis"] == "paley"]
    return c.iloc[0] if len(c) else None


def _metric_vs_theta(results: pd.DataFrame, out: Path, metric: str) -> Path | None:
    df = results[(results["status"] == "FINISHED") & results["dedup_of"].isna()]
    series = {}
    for n, g in df.groupby("rotation_dim"):
        if n > 2 and (g["basis"] == "paley").any():
            g = g[g["basis"] == "paley"]
        agg = g.groupby("theta")[metric].mean()
        series[f"N={n}" + (" (Paley)" if n > 2 and (g["basis"] == "paley").any() else "")] = (
            agg.index.to_numpy(), agg.to_numpy())
    if not series or all(len(x) == 0 for x, _ in series.values()):
        return None
    fig = line_figure(series, "RoPE base θ", f"{metric} (nats/token)" if "loss" in metric else metric,
                      f"{metric} vs θ per rotation dim", logx=True)
    return save(fig, out / f"{metric}_vs_theta.png")


def _rank_section(cells: pd.DataFrame, out: Path) -> tuple[list[Path], list[str]]:
    figs, notes = [], []
    have = cells[cells["attention_path"].map(lambda p: p.is_file())]
    for theta in sorted(have["theta"].unique()):
        base = _pick(have, 2, theta)
        if base is None:
            continue
        ref = load_stats(base["attention_path"])
        series, band = {}, {}
        for n in sorted(set(have["rotation_dim"]) - {2}):
            other = _pick(have, n, theta)
            if other is None:
                continue
            d = rank_difference(load_stats(other["attention_path"]), ref)
            label = f"{n}D {other['basis']} − 2D"
            series[label] = (d["layer"].to_numpy(), d["diff"].to_numpy())
            band[label] = (d["lo"].to_numpy(), d["hi"].to_numpy())
            notes.append(f"θ={theta:g}, {label}: mean Δerank over layers {d['diff'].mean():+.3f}")
        if series:
            fig = line_figure(series, "layer", "Δ effective rank (Roy–Vetterli, σ)",
                              f"effective rank difference, θ={theta:g}", band=band, hline=0.0)
            figs.append(save(fig, out / f"erank_diff_theta{theta:g}.png"))
    return figs, notes


def _fourier_section(cells: pd.DataFrame, out: Path, head_dim: int) -> list[Path]:
    have = cells[cells["profile_path"].map(lambda p: p.is_file())]
    if have.empty:
        return []
    theta = sorted(have["theta"].unique())[0]
    chosen = [c for n in sorted(have["rotation_dim"].unique()) if (c := _pick(have, n, theta)) is not None]
    profiles = {f"{int(c['rotation_dim'])}D {c['basis']}": load_profiles(c["profile_path"]) for c in chosen}
    n_layers = int(max(p["layer"].max() for p in profiles.values())) + 1
    layers = sorted({round(x) for x in np.linspace(0, n_layers - 1, min(5, n_layers))})
    figs = []
    for layer in layers:
        series, band_series = {}, {}
        for label, prof in profiles.items():
            stack = np.stack(prof.loc[prof["layer"] == layer, "logit_mean"].to_list())
            freqs, mag = fourier_magnitude(stack)
            series[label] = (freqs[1:], mag.mean(0)[1:])
            n = int(label.split("D")[0])
            f = np.unique(pair_frequencies(head_dim, n, theta))
            band_series[label] = (f, rope_band_magnitude(stack, f).mean(0))
        figs.append(save(line_figure(series, "frequency (rad/token)", "|rFFT(hann·(ℓ−mean))| (logit units)",
                                     f"Fourier attention magnitude, layer {layer}, θ={theta:g}", logy=True),
                         out / f"fourier_layer{layer}.png"))
        figs.append(save(line_figure(band_series, "block frequency θ_j (rad/token)", "|NUDFT| (logit units)",
                                     f"RoPE-band magnitude, layer {layer}, θ={theta:g}", logx=True, logy=True),
                         out / f"rope_band_layer{layer}.png"))
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
    out = sweep_dir / "report"
    out.mkdir(exist_ok=True)
    md = [f"# Sweep report: {name}", "",
          f"{len(results)} cells, {int((results['status'] == 'FINISHED').sum())} finished, "
          f"{int(results['dedup_of'].notna().sum())} answered by an equivalent cell (dedup).", ""]
    figures: list[Path] = []
    md += ["## Ablation table (mean ± 95% bootstrap half-CI over seeds)", ""]
    for metric in METRICS:
        if metric in results and results[metric].notna().any():
            md += [f"### {metric}", "", _markdown(ablation_table(results, metric)), ""]
    md += ["## Metric vs RoPE base θ", ""]
    for metric in ("val_loss", "val_loss_x4", "passkey_acc"):
        if metric in results and results[metric].notna().any() and (f := _metric_vs_theta(results, out, metric)):
            figures.append(f)
            md.append(f"![{metric} vs theta]({f.name})")
    md.append("")
    try:
        pk = load_passkey(sweep_dir)
        md += ["## Passkey retrieval: polar fans (radius = context length, angle = key depth)", ""]
        for n, g in pk.groupby("rotation_dim"):
            f = save(polar_fan(g, f"{n}D: passkey accuracy"), out / f"passkey_fan_{n}d.png")
            figures.append(f)
            md.append(f"![passkey {n}D]({f.name})")
        md.append("")
    except UserError as err:
        md += [f"_No passkey tables: {err}_", ""]
    rank_figs, notes = _rank_section(cells, out)
    if rank_figs:
        md += ["## Effective-rank difference per layer (vs 2D RoPE, 95% CI)", "", *[f"- {n}" for n in notes], ""]
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

        spec_uri = OmegaConf.create(plan["spec"]).get("tracking_uri") or None
    _log_to_mlflow(sweep_dir, name, [report, *figures], tracking_uri or spec_uri)
    return report


def _head_dim(plan: dict) -> int:
    from omegaconf import OmegaConf

    for cell in plan.get("cells", {}).values():
        m = OmegaConf.create(cell["config"]).model
        return int(m.head_dim or m.dim // m.n_heads)
    return 64
