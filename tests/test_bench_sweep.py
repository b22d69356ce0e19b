"""`hdrope bench sweep` runs both of its parts through the real Tune path on one Ray and prints them (here the test
process's shared Ray, which it leaves running)."""

import json

import pytest

from sweeps.console import main


@pytest.mark.slow
def test_bench_sweep_times_empty_trials_at_two_sizes_and_training_trials(cache_dir, shared_ray, capsys):
    assert main(["bench", "sweep", "--steps", "1", "--small", "1", "--large", "2", "--seeds", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["trials"] == 2 and r["empty_trials"] == [1, 2] and len(r["empty_s"]) == 2 and min(r["empty_s"]) > 0
    slope = r["empty_s"][1] - r["empty_s"][0]
    assert r["overhead_per_trial_s"] == pytest.approx(slope)
    assert r["fixed_per_sweep_s"] == pytest.approx(r["empty_s"][0] - slope)
    assert r["mean_per_trial_s"] == pytest.approx(r["empty_s"][1] / 2) and r["target_s"] == 0.5
    assert r["tune_over_sequential"] == pytest.approx(r["tune_s"] / r["sequential_s"])
    import ray

    assert ray.is_initialized()  # what it did not start, it did not stop


def test_bench_sweep_refuses_a_large_size_not_above_the_small_one_before_any_work(capsys):
    assert main(["bench", "sweep", "--small", "8", "--large", "8"]) == 2
    err = capsys.readouterr().err
    assert "--large 8: must be more than --small 8" in err and "Traceback" not in err
