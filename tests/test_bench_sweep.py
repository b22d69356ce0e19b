"""`hdrope bench sweep` refuses bad sizes before any work (its run through the real Tune path: test_sweeps_e2e.py,
on the shared Ray of the sweeps there)."""

from sweeps.console import main


def test_bench_sweep_refuses_a_large_size_not_above_the_small_one_before_any_work(capsys):
    assert main(["bench", "sweep", "--small", "8", "--large", "8"]) == 2
    err = capsys.readouterr().err
    assert "--large 8: must be more than --small 8" in err and "Traceback" not in err
