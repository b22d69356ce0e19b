"""Issue 34, the edges of the benches, `hdrope seeds`, `sweep plan --detect`, the batch producer, the loss by
position and a run whose loss goes non-finite: each hostile input gets the project's own message."""

from __future__ import annotations

import time

import pytest

from sweeps import console

BAD_BENCH_FLAGS = [
    (["tasks", "--rounds", "0"], "--rounds"),
    (["tasks", "--block", "0"], "--block"),
    (["tasks", "--threads", "-1"], "--threads"),
    (["tasks", "--ratio", "2"], "--ratio"),
    (["tasks", "--ratio", "nan"], "--ratio"),
    (["tasks", "--ratio", "-0.1"], "--ratio"),
    (["encodings", "--shape", "1", "2", "16", "-16"], "--shape"),
    (["encodings", "--shape", "0", "2", "16", "16"], "--shape"),
    (["encodings", "--threads", "-1"], "--threads"),
    (["encodings", "--json", "/nonexistent/dir/x.json"], "--json"),
    (["rotary", "--json", "/nonexistent/dir/x.json"], "--json"),
    (["rotary", "--dims", "0"], "--dims"),
    (["rotary", "--shape", "1", "1", "0", "8"], "--shape"),
    (["train", "--batch", "0"], "--batch"),
    (["train", "--rounds", "0"], "--rounds"),
    (["train", "--threads", "-2"], "--threads"),
    (["sweep", "--steps", "0"], "--steps"),
    (["sweep", "--concurrent", "0"], "--concurrent"),
    (["analysis", "--gib", "nan"], "--gib"),
    (["analysis", "--seconds", "inf"], "--seconds"),
]


@pytest.mark.parametrize(("args", "flag"), BAD_BENCH_FLAGS, ids=[" ".join(a) for a, _ in BAD_BENCH_FLAGS])
def test_a_bench_refuses_a_bad_flag_before_any_work(args, flag, capsys):
    """Issue 34 §10 and §12: `hdrope bench ...` with a count < 1, a negative thread count, a ratio outside [0, 1] or
    not finite, a non-positive shape, or a --json file in a missing folder exits 2 naming the flag, at once."""
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        console.main(["bench", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 5  # refused while parsing, before the bench ran


def test_a_json_path_that_is_a_directory_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        console.main(["bench", "encodings", "--json", str(tmp_path)])
    assert exit_.value.code == 2 and "argument --json" in capsys.readouterr().err
