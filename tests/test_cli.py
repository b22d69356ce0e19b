import json
import subprocess
import sys

import pytest


def run(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "sweeps.console", *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_import_hdrope_pulls_in_no_other_package():
    others = "('trainer', 'sweeps', 'analysis', 'ray', 'mlflow')"
    code = f"import sys, hdrope; print([m for m in sys.modules if m.split('.')[0] in {others}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bases_table_lists_paley_density():
    out = run("bases", "--max-n", "32", "--kind", "paley", "--csv").stdout.splitlines()
    rows = {r.split(",")[1]: r.split(",") for r in out[1:]}
    assert out[0].startswith("kind,n,")
    assert rows["4"][5] == "12" and rows["32"][5] == "688"
    assert "16" not in rows


@pytest.mark.parametrize(
    "args,needle",
    [
        (["bases", "--max-n", "1"], "--max-n must be"),
        (["frobnicate"], "unknown command"),
        (["bench", "warp"], "unknown command"),
        (["bases", "--kind", "qr"], "invalid choice"),
        (["data", "shuffle"], "invalid choice"),
        (["data", "prepare", "--out", "x", "model.dim=3"], "prepare takes data.* key=value overrides"),
        (["data", "prepare", "--out", "x", "data.tokenizer=bpe"], "shards need a fixed tokenizer"),
    ],
)
def test_user_errors_exit_2_with_a_message(args, needle):
    proc = run(*args, check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_output_piped_into_a_reader_that_stops_early_is_not_a_traceback():
    cmd = [sys.executable, "-m", "sweeps.console", "bases", "--max-n", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout.read(10)  # like `| head`: read a little, then hang up
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0
    assert "Traceback" not in err


def test_bench_rotary_small_run_reports_ratios(tmp_path):
    out = tmp_path / "b.json"
    proc = run(
        "bench",
        "rotary",
        "--shape",
        "1",
        "2",
        "64",
        "64",
        "--dims",
        "4",
        "--bases",
        "paley",
        "--modes",
        "eager",
        "--rounds",
        "2",
        "--json",
        str(out),
    )
    assert "floor" in proc.stdout
    data = json.loads(out.read_text())
    names = {r["name"] for r in data["rows"]}
    assert names == {"rope", "4D-paley"}
    rope = next(r for r in data["rows"] if r["name"] == "rope")
    assert data["floor_ms"] > 0
    for r in data["rows"]:  # every ratio is the row's own time over RoPE's, from the same run
        assert r["fwd_vs_rope"] == pytest.approx(r["fwd_ms"] / rope["fwd_ms"], rel=1e-2)


def test_bench_encodings_lists_every_kind_side_by_side(tmp_path, hdrope_here):
    from trainer.model.bench import SDPA
    from trainer.model.position import POSITION_ENCODINGS

    out = tmp_path / "e.json"
    assert hdrope_here(["bench", "encodings", "--shape", "1", "2", "32", "64", "--rounds", "1", "--json", str(out)]
                       ).returncode == 0
    rows = {r["encoding"]: r for r in json.loads(out.read_text())}
    assert len(rows) == len(POSITION_ENCODINGS) + 2  # every kind, plus HD-RoPE compiled and fused SDPA (for CoPE)
    assert {"RoPE", "4D Paley eager", "4D Paley compiled", "FoPE", "ALiBi", "NoPE", "CoPE", SDPA} <= set(rows)
    for r in rows.values():
        assert r["fwd_vs_rope"] == pytest.approx(r["fwd_ms"] / rows["RoPE"]["fwd_ms"], rel=1e-2)


def test_import_trainer_pulls_in_no_ray_or_sweeps():
    code = ("import sys, trainer.run.loop; "
            "print([m for m in sys.modules if m.split('.')[0] in ('sweeps', 'ray', 'analysis')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bench_train_prints_side_by_side_ratios(hdrope_here):
    out = hdrope_here(["bench", "train", "--preset", "tiny", "--dims", "4", "--rounds", "2", "--batch", "2", "--json",
                       "--kinds", "t5_bias", "cope"]).stdout
    res = json.loads(out)
    rows = {r["variant"]: r for r in res["rows"]}
    assert set(rows) == {"rope", "4D-paley", "4D-paley-fused", "hf-llama", "t5_bias", "cope"}
    for r in rows.values():  # ratios are computed from the rows' own figures, side by side
        assert r["vs_rope"] == pytest.approx(r["step_ms"] / rows["rope"]["step_ms"], rel=1e-2)
        assert r["vs_hf_tokens_per_s"] == pytest.approx(r["tokens_per_s"] / rows["hf-llama"]["tokens_per_s"], rel=1e-2)
    assert 0 < rows["rope"]["mfu"] < 5


def test_help_dispatches_without_importing_torch():
    code = ("import sys, sweeps.console; rc = sweeps.console.main(['--help']); "
            "print(rc, sorted(m for m in ('torch', 'numpy', 'trainer', 'sweeps', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 ['sweeps']"  # the console's own package, nothing heavy
    import hdrope  # the public names still resolve, on first use

    assert hdrope.HDRotary.__name__ == "HDRotary" and not issubclass(hdrope.UserError, ValueError)


def test_the_console_script_exits_without_teardown_yet_runs_exit_handlers_threads_and_flushes():
    """`cli()` skips the interpreter's module teardown (1-2.5 s after torch, MLflow and Ray), but what a normal exit
    does for the user still happens: its exit code, a running thread finished, exit handlers run, output flushed."""
    code = ("import atexit, sys, threading, time\n"
            "from sweeps import console\n"
            "atexit.register(lambda: print('handler ran'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"
            "sys.stdout.write('unflushed ')\n"
            "sys.argv = ['hdrope', *sys.argv[1:]]\n"
            "console.cli()\n"
            "print('not reached')\n")
    ok = subprocess.run([sys.executable, "-c", code, "bases", "--max-n", "4"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("unflushed ") and "\nidentity  2 " in ok.stdout
    assert ok.stdout.rstrip().endswith("thread done\nhandler ran") and "not reached" not in ok.stdout
    bad = subprocess.run([sys.executable, "-c", code, "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command" in bad.stderr and "handler ran" in bad.stdout
