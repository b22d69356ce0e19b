"""`hdrope theory`, `hdrope report` and `hdrope seeds` (which `hdrope sweep plan --detect` runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hdrope.errors import UserError

__all__ = ["report_main", "seeds_main", "theory_main"]

DEFAULT_STORAGE = "runs/sweeps"


def _check_theory_lengths(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """UserError naming the flag when --head-dim, --train-len or --max-distance is not a usable length."""
    for dest, unit in (("head_dim", "dims"), ("train_len", "tokens"), ("max_distance", "tokens")):
        value = getattr(a, dest)
        if value < 1:
            flag = "--" + dest.replace("_", "-")
            raise UserError(f"{flag} {value}: must be a positive number of {unit} (default {p.get_default(dest)})")
    if a.head_dim % 2:
        raise UserError(f"--head-dim {a.head_dim}: must be even (rotary dims come in pairs), e.g. 64")


def theory_main(argv: list[str]) -> int:
    """Theory curves for rotation dims × θ: decay bound, B(Δ), wavelengths, K mixing; PNGs and CSVs in --out."""
    p = argparse.ArgumentParser(prog="hdrope theory", description=theory_main.__doc__)
    p.add_argument("--rotation-dim", type=int, nargs="+", default=[2, 4, 8, 32])
    p.add_argument("--theta", type=float, nargs="+", default=[1e4, 5e5])
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--train-len", type=int, default=256, help="train length to compare wavelengths with (tokens)")
    p.add_argument("--max-distance", type=int, default=4096)
    p.add_argument("--out", required=True, help="output directory")
    a = p.parse_args(argv)
    _check_theory_lengths(p, a)
    for n in a.rotation_dim:
        if n < 2 or n % 2 or a.head_dim % n:
            raise UserError(f"--rotation-dim {n}: must be even and divide --head-dim {a.head_dim}")
    if any(t <= 1 for t in a.theta):
        raise UserError(f"--theta {a.theta}: every base must be > 1")

    from analysis.plots import line_figure, save
    from analysis.theory import b_curve, decay_curve, mixing_table, theory_table, wavelengths

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    table = theory_table(a.rotation_dim, a.theta, a.head_dim, a.train_len, a.max_distance)
    table.to_csv(out / "theory.csv", index=False)
    mixing_table(a.rotation_dim).to_csv(out / "mixing.csv", index=False)
    d = np.unique(np.geomspace(1, a.max_distance, 400).astype(int))
    for theta in a.theta:
        decay = {f"N={n}": (d, decay_curve(a.head_dim, n, theta, d)) for n in a.rotation_dim}
        save(line_figure(decay, "relative distance Δ (tokens)", "relative upper bound (2/d)·Σ|S_j|",
                         f"RoFormer long-term decay, θ={theta:g}, d={a.head_dim}", logx=True),
             out / f"decay_theta{theta:g}.png")
        b = {f"N={n}": (d, b_curve(a.head_dim, n, theta, d)) for n in a.rotation_dim}
        save(line_figure(b, "relative distance Δ (tokens)", "B(Δ) = Σ_j cos(Δθ_j)",
                         f"Men et al. B(Δ), θ={theta:g}", logx=True, hline=0.0), out / f"b_curve_theta{theta:g}.png")
        wl = {f"N={n}": (np.arange(len(w := wavelengths(a.head_dim, n, theta))), w) for n in a.rotation_dim}
        save(line_figure(wl, "block index j", "wavelength 2π/θ_j (tokens)",
                         f"block wavelengths, θ={theta:g} (dashed: train length)", logy=True, hline=a.train_len),
             out / f"wavelengths_theta{theta:g}.png")
    print(table.to_string(index=False))
    print(f"\nwrote {out}/theory.csv, mixing.csv and {3 * len(a.theta)} PNGs")
    return 0


def report_main(argv: list[str]) -> int:
    """`hdrope report NAME`: Markdown + PNG figures in the sweep dir, logged to the sweep's MLflow parent run.
    `--ship FOLDER` also writes the study's shipped results there (cells.csv, comparisons.csv, study.json);
    `hdrope report --from-results FOLDER` rebuilds the report's tables and verdicts from such a folder alone;
    `hdrope report --docs` rewrites the docs' generated results blocks from experiments/results/."""
    p = argparse.ArgumentParser(prog="hdrope report", description=report_main.__doc__)
    p.add_argument("name", nargs="?", default="", help="sweep name or sweep directory")
    p.add_argument("--storage", default="runs/sweeps")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--ship", default="", metavar="FOLDER",
                   help="also write the study's shipped results into FOLDER, e.g. experiments/results/quickstart")
    p.add_argument("--force", action="store_true",
                   help="with --ship: replace the shipped results of another study already in FOLDER")
    p.add_argument("--add", action="store_true",
                   help="with --ship: add the sweep's cells (a later stage: more seeds) to the study shipped in FOLDER")
    p.add_argument("--from-results", default="", metavar="FOLDER",
                   help="rebuild the report from a shipped results folder alone (no run directories)")
    p.add_argument("--out", default="", help="with --from-results: write the Markdown here instead of printing it")
    p.add_argument("--docs", action="store_true",
                   help="rewrite every <!-- results:STUDY:TABLE --> block of README.md and docs/*.md from "
                        "experiments/results/")
    a = p.parse_args(argv)
    if a.add and not a.ship:
        raise UserError("--add goes with --ship FOLDER: the study shipped there takes the sweep's cells")
    if a.docs or a.from_results:
        return _shipped_main(a)
    if not a.name:
        raise UserError("give a sweep NAME (or --from-results FOLDER, or --docs)")
    path = Path(a.name)
    if not (path / "results.parquet").is_file():
        if "/" in a.name or ".." in a.name:
            raise UserError(f"{a.name!r}: no results.parquet there; give a sweep name or directory")
        path = Path(a.storage) / a.name
    from analysis.report import build_report, verdict_lines

    report = build_report(path, a.tracking_uri)
    print("\n".join(verdict_lines(report.parent)))
    print(f"\nwritten to {report}")
    if a.ship:
        from analysis.shipped import ship

        print(f"shipped: {', '.join(str(f) for f in ship(path, a.ship, a.force, a.add))}")
    return 0


def _shipped_main(a: argparse.Namespace) -> int:
    """`hdrope report --from-results FOLDER` and `hdrope report --docs`."""
    if a.name or a.ship:
        raise UserError("--from-results and --docs read shipped results only: leave out NAME and --ship")
    if a.docs:
        from analysis.docs_results import doc_files, regenerate

        changed = regenerate(doc_files())
        print("\n".join(f"rewrote {f}" for f in changed) or "every results block is up to date")
        return 0
    from analysis.shipped import rebuild, refuse_overwrite

    out = refuse_overwrite(a.out, a.from_results) if a.out else None
    text = rebuild(a.from_results)
    if out is not None:
        try:
            out.write_text(text)
        except OSError as err:
            raise UserError(f"--out {a.out}: could not write the report ({err.strerror or err}); give another path") \
                from None
        print(f"written to {a.out}")
    else:
        print(text)
    return 0


def seeds_main(argv: list[str]) -> int:
    """`hdrope seeds SPEC --detect D --pilot SWEEP` (also `hdrope sweep plan SPEC --detect ...`): the seeds the
    planned sweep needs to detect a difference D at 80% power after the report's Holm correction, from the per-seed
    spread the finished pilot sweep measured (a power calculation on stored results: `analysis.power`)."""
    p = argparse.ArgumentParser(prog="hdrope seeds", description=seeds_main.__doc__)
    p.add_argument("spec", help="the sweep spec YAML to size")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec key")
    p.add_argument("--detect", type=float, required=True, metavar="DIFF",
                   help="the difference in --metric to detect (80%% power, after the report's Holm correction)")
    p.add_argument("--pilot", default="", help="a finished sweep (name or directory) to take the spread from")
    p.add_argument("--metric", default="", help="the metric (default: the spec's search.metric)")
    p.add_argument("--storage", default=DEFAULT_STORAGE, help="where --pilot is looked up by name")
    a = p.parse_args(argv)
    from analysis.power import seed_advice
    from sweeps.design_warnings import design_warnings
    from sweeps.results import planned_frame
    from sweeps.runner import prepare

    plan = prepare(a.spec, a.set)
    if not a.pilot:
        raise UserError(f"--detect {a.detect} needs --pilot SWEEP: a finished sweep (name or directory) whose "
                        "per-seed spread sizes the answer, e.g. --pilot quickstart")
    pilot = Path(a.pilot)
    if not pilot.is_dir() and "/" not in a.pilot and ".." not in a.pilot:
        pilot = Path(a.storage) / a.pilot
    if plan.spec.questions:  # the declared family is what the report will correct over
        from analysis.questions import question_advice

        advice, said = question_advice(pilot, planned_frame(plan), plan.spec.questions, a.detect, a.metric)
        print("\n".join([*said, *advice.lines()]))
    else:
        advice = seed_advice(pilot, planned_frame(plan), a.metric or plan.spec.search.metric, a.detect)
        print("\n".join(advice.lines()))
    for note in design_warnings(plan.cells, plan.compares, a.detect):  # the windows judged against --detect
        print(f"warning: {note}", file=sys.stderr)
    return 0

