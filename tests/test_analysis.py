"""Analysis: known answers, streaming loaders and their errors, theory curves, the report and its CLI."""

import os

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis.load import iter_maps, load_profiles, load_stats, sweep_cells
from analysis.rank import layerwise_rank, per_seed, rank_difference, seed_interval
from analysis.stats import mean_interval
from analysis.theory import b_curve, decay_curve, first_zero, mixing_table, pair_frequencies
from hdrope.errors import UserError


def test_effective_rank_known_answers():
    eye = np.eye(32)
    assert analysis.effective_rank(eye) == pytest.approx(32)
    rank1 = np.outer(np.ones(32), np.arange(1, 33) / 528)
    assert analysis.effective_rank(rank1) == pytest.approx(1, abs=1e-9)
    # uniform causal map: rows 1/i over the first i keys; closed form from its singular values
    uniform = np.tril(np.ones((16, 16))) / np.arange(1, 17)[:, None]
    s = np.linalg.svd(uniform, compute_uv=False)
    p = s / s.sum()
    assert analysis.effective_rank(uniform) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-12)
    assert analysis.effective_rank(uniform, method="gram") == pytest.approx(analysis.effective_rank(uniform), rel=1e-6)
    batch = np.stack([eye, np.eye(32)[::-1]])
    np.testing.assert_allclose(analysis.effective_rank(batch), [32, 32])


def test_fourier_peak_at_the_profile_frequency():
    omega = 2 * np.pi * 24 / 512  # on the rFFT grid
    profile = np.cos(omega * np.arange(512)) + 3.0
    freqs, mag = analysis.fourier_magnitude(profile)
    assert freqs[np.argmax(mag)] == pytest.approx(omega)
    assert freqs[-1] == pytest.approx(np.pi)  # rad/token
    off_grid = 0.3
    band = analysis.rope_band_magnitude(np.cos(off_grid * np.arange(512)), np.array([0.1, off_grid, 0.9]))
    assert np.argmax(band) == 1


def test_distance_profile_averages_diagonals():
    logits = np.arange(16.0).reshape(4, 4)
    prof = analysis.distance_profile(logits)
    assert prof.tolist() == [np.mean([0, 5, 10, 15]), np.mean([4, 9, 14]), np.mean([8, 13]), 12.0]
    with pytest.raises(ValueError, match=r"\(\.\.\., L, L\)"):
        analysis.distance_profile(np.zeros((3, 4)))


def test_two_d_decay_curve_is_roformers_formula():
    d, theta = 64, 1e4
    deltas = np.arange(0, 300)
    theta_i = theta ** (-2 * np.arange(d // 2) / d)  # RoFormer's θ_i = 10000^(−2i/d)
    s = np.cumsum(np.exp(1j * np.outer(deltas, theta_i)), axis=1)
    np.testing.assert_allclose(decay_curve(d, 2, theta, deltas), np.abs(s).mean(1), rtol=1e-12)
    assert len(pair_frequencies(d, 4, theta)) == d // 2 and len(np.unique(pair_frequencies(d, 4, theta))) == d // 4
    far = np.arange(2000)
    b = b_curve(d, 2, theta, far)
    direct = np.cos(np.outer(far, theta_i)).sum(1)
    np.testing.assert_allclose(b, direct, atol=1e-9)
    assert b[0] == d // 2 and first_zero(b, far) == far[np.argmax(direct <= 0)] == 725
    assert first_zero(b[:300], far[:300]) is None
    mix = mixing_table([4, 32])
    assert mix.set_index(["rotation_dim", "basis"]).loc[(4, "paley"), "k_nonzero"] == 12


def test_mean_interval_covers_the_true_mean_at_the_stated_rate():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(300):
        sample = rng.exponential(2.0, size=40)  # true mean 2, skewed
        iv = mean_interval(sample)
        hits += iv.lo <= 2.0 <= iv.hi
    assert 0.90 <= hits / 300 <= 0.98


def test_layerwise_rank_and_difference_from_a_tiny_sweep(tiny_sweep):
    cells = sweep_cells(tiny_sweep)
    assert len(cells) == 6 and all(p.is_file() for p in cells["attention_path"])
    stats = load_stats(cells["attention_path"][0])
    assert set(stats["layer"]) == {0, 1} and len(stats) == 2 * 2 * 2  # samples x layers x heads
    lw = layerwise_rank(stats)  # one run: a description (mean and spread over heads x samples), no interval
    assert list(lw.columns) == ["layer", "mean", "sd", "n"] and (lw["n"] == 4).all()
    # intervals and differences are over seeds: two seeds of 2D RoPE identity vs two of 4D Paley, paired by seed
    rope = cells[(cells["rotation_dim"] == 2)]
    paley = cells[(cells["rotation_dim"] == 4) & (cells["basis"] == "paley")]
    seeded = {name: per_seed(pd.concat([load_stats(p).assign(seed=s)
                                        for p, s in zip(g["attention_path"], g["seed"], strict=True)]))
              for name, g in (("rope", rope), ("paley", paley))}
    assert sorted(seeded["rope"]["seed"].unique()) == [1, 2]
    iv = seed_interval(seeded["rope"])
    assert (iv["n"] == 2).all() and (iv["lo"] <= iv["mean"]).all() and (iv["mean"] <= iv["hi"]).all()
    diff = rank_difference(seeded["paley"], seeded["rope"])
    assert len(diff) == 2 and diff["paired"].all() and (diff["lo"] <= diff["hi"]).all()
    assert not diff["testable"].any()  # 2 paired seeds: a sign-flip test cannot reach 5%
    # stored erank equals a recomputation from the stored maps
    ids, maps = next(iter_maps(cells["attention_path"][0], layers=[1], heads=[0]))
    assert set(ids["layer"]) == {1} and maps.shape == (2, 64, 64)
    np.testing.assert_allclose(ids["erank"], analysis.effective_rank(maps), rtol=1e-2)
    prof = load_profiles(cells["profile_path"][0], layers=[0])
    assert len(prof) == 2 and prof["logit_mean"][0].shape == (64,)


def test_truncated_and_foreign_files_get_clear_errors(tiny_sweep, tmp_path):
    path = sweep_cells(tiny_sweep)["attention_path"][0]
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(UserError, match=r"cut\.parquet: not a readable Parquet file"):
        load_stats(cut)
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(foreign)
    with pytest.raises(UserError, match="not an hdrope dump"):
        load_stats(foreign)
    with pytest.raises(UserError, match="no such dump file"):
        load_stats(tmp_path / "missing.parquet")


def test_report_from_a_sweep_writes_markdown_and_real_pngs(tiny_sweep, hdrope_here):
    from PIL import Image

    out = hdrope_here(["report", str(tiny_sweep)])
    assert out.returncode == 0, out.stderr[-2000:]
    md = (tiny_sweep / "report" / "report.md").read_text()
    assert "## Outcome tables" in md and "| 2D RoPE |" in md and "± " in md and "(n=2)" in md  # 2 seeds -> CIs
    assert "polar fans" in md and "Effective attention rank" in md and "Fourier" in md
    # 2 paired seeds cannot reach 5% with an exact sign-flip test: no mark, the table says so
    assert " *" not in md.split("## Costs")[0] and "too few seeds to test" in md
    assert "0/12 = 0.0% [0.0%, 24.2%]" in md  # passkey accuracy as k/n with Wilson's interval
    costs = md.split("## Costs")[1].split("##")[0]
    assert "tokens_per_s" in costs and "tokens_per_s" not in md.split("## Costs")[0]  # costs are tabled apart
    assert "eval_s" in costs and "## Loss by position" in md and "### Effective length" in md
    # every variant that trained is in every section: tables, fans, rank differences (identity included)
    for variant in ("2D RoPE", "4D identity", "4D Paley"):
        assert f"| {variant} |" in md and f"![passkey {variant}, θ=10000]" in md
    assert "4D identity − 2D RoPE" in md and "4D Paley − 2D RoPE" in md
    assert "θ takes fewer than two values" in md  # a one-θ sweep draws no metric-vs-θ dots
    pngs = sorted((tiny_sweep / "report").glob("*.png"))
    assert len(pngs) >= 7
    for png in pngs:
        img = np.asarray(Image.open(png).convert("L"), dtype=float)
        assert img.shape[0] > 200 and img.std() > 5  # decodes and is not blank


def test_theory_cli_writes_csv_and_plots(tmp_path, hdrope_here):
    out = hdrope_here(["theory", "--rotation-dim", "2", "4", "8", "32", "--theta", "1e4", "5e5", "--out",
                       str(tmp_path)])
    assert out.returncode == 0, out.stderr
    table = pd.read_csv(tmp_path / "theory.csv")
    assert len(table) == 8 and table.set_index(["rotation_dim", "theta"]).loc[(32, 1e4), "n_frequencies"] == 2
    assert len(list(tmp_path.glob("*.png"))) == 6
    bad = hdrope_here(["theory", "--rotation-dim", "6", "--out", str(tmp_path)])
    assert bad.returncode == 2 and "--rotation-dim 6" in bad.stderr


def test_bench_analysis_reports_side_by_side_rates(hdrope_here):
    out = hdrope_here(["bench", "analysis", "--gib", "0.01", "--seconds", "1", "--json"])
    assert out.returncode == 0, out.stderr
    import json

    rows = json.loads(out.stdout)
    assert [r["L"] for r in rows] == [256, 1024] and all(r["maps_per_s"] > 0 and r["speedup"] > 0 for r in rows)


@pytest.mark.parametrize("name", ["a_attention_explorer", "b_rank_and_fourier", "c_results_and_tables"])
def test_notebooks_run_top_to_bottom_on_a_sweep(tiny_sweep, name):
    import nbformat
    from nbclient import NotebookClient

    from analysis import NOTEBOOKS_DIR

    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    from analysis.load import REPO_ROOT

    # opened from its own folder, with the sweep named relative to the repository (as in the shipped default)
    params.source = f"sweep_dir = {os.path.relpath(tiny_sweep, REPO_ROOT)!r}"
    here = {"metadata": {"path": str(NOTEBOOKS_DIR)}}

    def snapshot(folder):
        return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.exists() else None

    before = snapshot(tiny_sweep / "report")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources=here).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any(o.output_type in ("execute_result", "display_data", "stream") for o in outputs)
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure rendered inline"
    texts = [o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs]
    assert not [t for t in texts if "<matplotlib." in t], "a cell echoes a matplotlib object"
    if name == "c_results_and_tables":  # reads the sweep, writes and logs nothing
        assert not (tiny_sweep / "report").exists() or before == snapshot(tiny_sweep / "report")


def test_report_is_logged_to_the_sweeps_mlflow_parent_run(tiny_sweep, tmp_path):
    import shutil

    import mlflow

    from analysis.report import build_report
    from trainer.run.tracking import SweepTracker

    sweep = tmp_path / "copy"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report"))
    uri = f"sqlite:///{sweep / 'mlflow.db'}"
    parent = SweepTracker(uri, "tinysweep", sweep / "artifacts").parent_run()
    report = build_report(sweep)
    assert report == sweep / "report" / "report.md"
    names = {a.path for a in mlflow.MlflowClient(uri).list_artifacts(parent, "report")}
    assert "report/report.md" in names and any(n.endswith(".png") for n in names)


def test_find_sweep_dir_from_any_working_directory(tiny_sweep, tmp_path, monkeypatch):
    from analysis.load import REPO_ROOT, find_sweep_dir
    from hdrope.errors import UserError

    monkeypatch.chdir(tmp_path)
    assert find_sweep_dir(os.path.relpath(tiny_sweep, REPO_ROOT)) == tiny_sweep.resolve()
    assert find_sweep_dir(tiny_sweep) == tiny_sweep.resolve()
    with pytest.raises(UserError, match="no sweep there"):
        find_sweep_dir("runs/sweeps/no-such-sweep")


def test_sweep_plan_detect_prints_the_seeds_a_difference_needs(tiny_sweep, tmp_path, hdrope_here):
    """`plan --detect D --pilot SWEEP`: the paired answer is the power calculation at the pilot's largest per-seed
    spread of paired differences, at the Holm level of the plan's comparisons (2 here: 4D identity and 4D Paley)."""
    from analysis.stats import seeds_needed

    spec = tmp_path / "next.yaml"
    spec.write_text("name: next\nbase: tiny\naxes:\n  model.pe.rotation_dim: [2, 4]\n"
                    "  model.pe.basis: [identity, paley]\n  seed: [1, 2, 3]\n")
    out = hdrope_here(["sweep", "plan", str(spec), "--detect", "0.02", "--pilot", str(tiny_sweep), "--metric",
                       "val_loss_x2"])
    assert out.returncode == 0, out.stderr[-2000:]
    results = pd.read_parquet(tiny_sweep / "results.parquet")
    done = results[results["dedup_of"].isna()]
    rope = done[done["rotation_dim"] == 2].set_index("seed")["val_loss_x2"]
    sds = [float((done[(done["rotation_dim"] == 4) & (done["basis"] == b)].set_index("seed")["val_loss_x2"] - rope)
                 .std(ddof=1)) for b in ("identity", "paley")]
    want = seeds_needed(0.02, max(sds), paired=True, alpha=0.05 / 2)
    assert f"paired (every variant on the same seeds, as `axes: {{seed: [...]}}` runs them): {want} seeds" in out.stdout
    assert "Holm over the plan's 2 comparisons" in out.stdout and "this plan runs 3 seeds per cell" in out.stdout
    bad = hdrope_here(["sweep", "plan", str(spec), "--detect", "0.02"])
    assert bad.returncode == 2 and "needs --pilot" in bad.stderr and "Traceback" not in bad.stderr
    # the analysis owns the calculation: `hdrope seeds` is the same command
    same = hdrope_here(["seeds", str(spec), "--detect", "0.02", "--pilot", str(tiny_sweep), "--metric",
                        "val_loss_x2"])
    assert same.returncode == 0 and same.stdout == out.stdout
