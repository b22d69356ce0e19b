"""The passkey dataset builder (token-exact buckets, depth coverage, budgets, provenance) and its evaluator."""

import json
import re
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from hdrope.errors import UserError
from trainer.data.tokenizer import ByteTokenizer
from trainer.evals.passkey.builder import BuildConfig, build_dataset

NAME = re.compile(r"^x(\d+)_y(\d+)_xt(\d+)_yt(\d+)_T(\d+)\.jsonl$")
MULTI = dict(multi_token=True, v_min=10000, v_max=99999, max_len=1280, lines_per_file=3)


def files_of(root):
    return sorted(p for p in root.glob("*/*.jsonl"))


def test_every_file_retokenizes_inside_its_bucket_and_matches_its_name(tmp_path, cache_dir):
    tok = ByteTokenizer()
    res = build_dataset(tok, BuildConfig(**MULTI), tmp_path / "ds", cache_dir=cache_dir)
    meta = json.loads((tmp_path / "ds" / "dataset_meta.json").read_text())
    f_tokens = meta["filler_tokens"]
    widths = {u: u - low for low, u in meta["buckets"]}
    found = files_of(tmp_path / "ds")
    assert len(found) == res["files"] > 5
    depths = set()
    for f in found:
        x, y, xt, yt, t = map(int, NAME.match(f.name).groups())
        u = int(f.parent.name)
        assert (xt, yt) == (x * f_tokens, y * f_tokens) and u - widths[u] < t <= u
        for line in f.read_text().splitlines():
            item = json.loads(line)
            assert len(tok.encode(item["question"])) == t
            assert f"The pass key is {item['answer']}." in item["question"]
        depths.add(round(x / (x + y), 2))
    assert min(depths) < 0.2 and max(depths) > 0.8  # early-key to late-key coverage
    need = {"tokenizer", "buckets", "passkey_range", "filler_tokens", "base_tokens", "seed", "budget_bytes"}
    assert need <= set(meta)


def test_dry_run_plan_equals_written_plan_and_budgets_hold_to_the_byte(tmp_path, cache_dir):
    tok = ByteTokenizer()
    cfg = BuildConfig(**{**MULTI, "budget_bytes": 30_000})
    dry = build_dataset(tok, cfg, tmp_path / "dry", dry_run=True, cache_dir=cache_dir)
    real = build_dataset(tok, cfg, tmp_path / "real", cache_dir=cache_dir)
    assert not files_of(tmp_path / "dry") and dry["plan"] == real["plan"]
    assert dry["bytes"] == real["bytes"] and "bucket cap" in real["stop_reasons"].values()
    on_disk = sum(f.stat().st_size for f in files_of(tmp_path / "real"))
    assert on_disk == real["bytes"] <= real["estimated_bytes"] <= 30_000
    caps = json.loads((tmp_path / "real" / "dataset_meta.json").read_text())["bucket_caps"]
    for u, stats in real["buckets"].items():
        assert stats["bytes"] <= caps[u]
    assert caps["512"] > caps["1280"]  # caps shrink as U grows
    flat = build_dataset(tok, BuildConfig(**{**MULTI, "budget_bytes": 20_000, "bucket_cap_bytes": 10**9}),
                         tmp_path / "flat", cache_dir=cache_dir)
    assert "global budget" in flat["stop_reasons"].values() and flat["bytes"] <= 20_000


def test_same_seed_gives_byte_identical_output(tmp_path, cache_dir):
    tok = ByteTokenizer()
    for d in ("a", "b"):
        build_dataset(tok, BuildConfig(**MULTI), tmp_path / d, cache_dir=cache_dir)
    a, b = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    assert [f.relative_to(tmp_path / "a") for f in a] == [f.relative_to(tmp_path / "b") for f in b]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
    other = build_dataset(tok, BuildConfig(**{**MULTI, "seed": 7}), tmp_path / "c", cache_dir=cache_dir)
    assert other["files"] == len(a)
    assert any(x.read_bytes() != y.read_bytes() for x, y in zip(a, files_of(tmp_path / "c"), strict=True))


def test_single_token_pool_and_its_empty_pool_error(tmp_path, cache_dir):
    tok = ByteTokenizer()
    res = build_dataset(tok, BuildConfig(form="nospace", v_min=1, v_max=9, max_len=768), tmp_path / "ds",
                        cache_dir=cache_dir)
    assert res["lines"] > 0
    with pytest.raises(UserError, match="try --form nospace, or --multi-token"):
        build_dataset(tok, BuildConfig(v_min=1, v_max=99), tmp_path / "x", cache_dir=cache_dir)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--v-min", "10", "--v-max", "5"], "--v-min 10 > --v-max 5"),
        (["--budget", "0"], "--budget 0"),
        (["--min-len", "0", "--max-len", "600", "--multi-token"], "narrower than the template"),
        (["--bucket-width", "16", "--multi-token"], "--bucket-width 16 is narrower than one filler"),
        (["--tokenizer", "/nope/tokenizer.json"], "--tokenizer '/nope/tokenizer.json'"),
    ],
)
def test_bad_builder_inputs_exit_2(tmp_path, args, match):
    if "--tokenizer" not in args:
        args = ["--tokenizer", "bytes", *args]
    out = subprocess.run([sys.executable, "-m", "sweeps.console", "passkey", "build", "--out", str(tmp_path / "o"),
                          *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and match in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_evaluator_scores_a_checkpoint_into_a_parquet_table(tmp_path, tiny_cfg, cache_dir, hdrope_here):
    from trainer.run.loop import train

    run = train(tiny_cfg("train.steps=4", "eval.passkey.enabled=false", "eval.extrapolation_batches=0"))
    build_dataset(ByteTokenizer(), BuildConfig(**{**MULTI, "max_len": 768, "lines_per_file": 1}), tmp_path / "ds",
                  cache_dir=cache_dir)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = hdrope_here(["passkey", "eval", str(run.checkpoint), str(tmp_path / "ds"), "--no-progress",
                       "--tracking-uri", uri])
    assert out.returncode == 0, out.stderr[-2000:]
    from trainer.evals.passkey.table import PASSKEY_SCHEMA, read_passkey_table

    path = out.stdout.strip().splitlines()[-1]
    assert pq.read_schema(path).remove_metadata() == PASSKEY_SCHEMA  # the one schema, as training writes it
    table = read_passkey_table(path).to_pandas()
    assert set(table["target_length"]) == {512, 768}
    assert len(table) == len(files_of(tmp_path / "ds")) and table["correct"].dtype == bool
    assert ((table["length"] > 256) & (table["length"] <= table["target_length"])).all()
    assert (table["rotation_dim"] == 4).all() and (table["config_hash"] == run.config_hash).all()
    import mlflow

    client = mlflow.MlflowClient(uri)
    (r,) = client.search_runs([client.get_experiment_by_name("hdrope-passkey").experiment_id])
    assert {"passkey_acc", "passkey_acc_U512", "passkey_acc_U768"} <= set(r.data.metrics)


def test_training_the_builder_and_the_evaluator_assemble_prompts_and_place_keys_alike(tmp_path, cache_dir):
    """One assembler (`prompt_parts`) and one depth (the fraction of filler tokens before the key): the builder's
    questions are its text, the training prompter's tokens are its parts tokenized, and the depth each reports (the
    evaluator's from the builder's file names) is the one measured on the prompt itself."""
    from trainer.config import PasskeyFormat
    from trainer.data.passkey_prompt import PasskeyPrompter, filler_sentences, key_depth, prompt_parts
    from trainer.evals.passkey.builder import FILE_NAME

    fmt = PasskeyFormat()
    tok = ByteTokenizer()

    def measured(text: str, passkey: object) -> float:
        key = fmt.key.replace("{k}", str(passkey))
        start, end = text.index(key), text.index(fmt.question, text.index(key))
        return key_depth(start - len(fmt.header), end - start - len(key))

    build_dataset(tok, BuildConfig(**{**MULTI, "max_len": 768, "lines_per_file": 1}), tmp_path / "ds",
                  cache_dir=cache_dir)
    for f in files_of(tmp_path / "ds"):
        name = FILE_NAME.match(f.name)
        item = json.loads(f.read_text().splitlines()[0])
        assert item["question"] == "".join(prompt_parts(fmt, [fmt.filler], int(name["x"]), int(name["y"]),
                                                        item["answer"]))
        assert key_depth(int(name["xt"]), int(name["yt"])) == pytest.approx(measured(item["question"], item["answer"]))
    prompter = PasskeyPrompter(tok, fmt)
    for depth in (0.1, 0.5, 0.9):
        p = prompter.build(1024, depth, 4242)
        parts = prompt_parts(fmt, filler_sentences(fmt), p.x, p.y, 4242)
        assert p.prompt == [t for part in parts for t in tok.encode(part)]
        assert p.depth == pytest.approx(measured(tok.decode(p.prompt), 4242))


def test_a_passkey_eval_table_of_the_old_layout_is_read_in_the_one_schema(tmp_path):
    """`hdrope passkey eval` wrote a row per (bucket, depth bin) before issue 18: read as that many prompt rows."""
    import pyarrow as pa

    from trainer.evals.passkey.table import PASSKEY_SCHEMA, read_passkey_table

    old = pd.DataFrame({"bucket_u": [512, 768], "depth_bin": [0.05, 0.95], "accuracy": [0.5, 0.0], "n": [4, 2],
                        "pe_kind": "hdrope", "pe_label": "4D Paley", "rotation_dim": 4, "basis": "paley",
                        "basis_seed": None, "theta": 10000.0, "scaling": "none", "config_hash": "abc",
                        "checkpoint": "x", "target_length": [512, 768], "depth_target": [0.05, 0.95],
                        "correct": [0.5, 0.0]})
    old.to_parquet(tmp_path / "eval_abc.parquet", index=False)
    table = read_passkey_table(tmp_path / "eval_abc.parquet")
    assert table.schema == PASSKEY_SCHEMA
    df = table.to_pandas()
    assert df.groupby("target_length")["correct"].agg(["sum", "size"]).to_dict("index") == {
        512: {"sum": 2, "size": 4}, 768: {"sum": 0, "size": 2}}
    assert (df["config_hash"] == "abc").all() and (df["pe_label"] == "4D Paley").all()
    assert pa.types.is_int32(table.schema.field("rotation_dim").type)


def test_training_prompts_end_the_answer_so_a_model_learns_to_stop():
    # Without what follows the key, a model that retrieved it kept writing digits (" 1733") and the exact match
    # of the first integer failed: 0% passkey accuracy for a model that had learned the retrieval.
    import numpy as np

    from trainer.config import PasskeyFormat
    from trainer.data.passkey_prompt import PasskeyPrompter, first_integer

    tok = ByteTokenizer()
    prompter = PasskeyPrompter(tok, PasskeyFormat(header="", max_key=999))
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = prompter.sample_training(129, rng)
        text = tok.decode(ids)
        assert len(ids) <= 129
        answer = text.rsplit("The pass key is", 1)[1]
        assert answer.endswith(".") and first_integer(answer) == first_integer(text)
