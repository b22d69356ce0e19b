"""Attention dumps (schema, content, budget), attention statistics, KV-cache decoding, passkey prompts, HF parity."""

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from hdrope.diagnostics import effective_rank, row_entropy
from hdrope.errors import UserError
from trainer.config import DumpConfig, PasskeyFormat
from trainer.data.passkey_prompt import PasskeyPrompter, first_integer
from trainer.data.tokenizer import ByteTokenizer
from trainer.evals.attention_dump import DumpIds, dump_attention
from trainer.model.generate import greedy_generate
from trainer.model.llama import KVCache, Llama
from trainer.model.position import PEConfig, encoding_identity
from trainer.presets import load_model_args
from trainer.run.loop import train


def _model(**pe):
    torch.manual_seed(3)
    args = load_model_args("tiny")
    for k, v in pe.items():
        setattr(args.pe, k, v)
    return Llama(args).eval()


def test_dump_rows_are_softmax_maps_with_matching_statistics(tmp_path):
    model = _model()
    tokens = torch.randint(0, 259, (3, 40))
    ids = DumpIds("r1", "abc", 5, encoding_identity(model.args.pe))
    attn_path, prof_path = dump_attention(model, tokens, DumpConfig(samples=3, heads=[1]), ids, tmp_path)
    pf = pq.ParquetFile(attn_path)
    assert pf.num_row_groups == 2  # one per layer
    t = pf.read()
    assert t.num_rows == 3 * 2 * 1 and set(t.column("head").to_pylist()) == {1}
    assert t.schema.field("attn").type.extension_name == "arrow.fixed_shape_tensor"
    assert pf.schema_arrow.metadata[b"hdrope.dump_schema"] == b"3"
    assert set(t.column("form").to_pylist()) == {"full"} and t.column("query_rows").null_count == 6
    assert t.column("pe_label").to_pylist() == ["4D Paley"] * 6 and t.column("basis_seed").null_count == 6
    maps = t.column("attn").combine_chunks().to_numpy_ndarray().astype(np.float64)
    assert maps.shape == (6, 40, 40)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=2e-2)  # rows are distributions (fp16)
    assert np.all(np.triu(maps, 1) == 0)  # causal
    np.testing.assert_allclose(t.column("erank").to_numpy(), effective_rank(maps), rtol=2e-2)
    np.testing.assert_allclose(t.column("entropy").to_numpy(), row_entropy(maps), rtol=2e-2, atol=1e-3)
    prof = pq.read_table(prof_path)
    assert prof.num_rows == 2 and len(prof.column("logit_mean")[0]) == 40
    # recompute layer 0, head 1's profile from the model's own q, k
    cap = {}
    model(tokens, capture=cap)
    q, k = cap[0].q, cap[0].k.repeat_interleave(2, dim=1)
    logits = (q[:, 1] @ k[:, 1].transpose(-1, -2)) / math.sqrt(32)
    want = [torch.diagonal(logits, -d, dim1=-2, dim2=-1).mean().item() for d in (0, 7, 39)]
    got = prof.column("logit_mean")[0].as_py()
    np.testing.assert_allclose([got[0], got[7], got[39]], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["hdrope", "stickbreaking"])
def test_a_long_dump_stores_pooled_maps_or_sampled_rows_of_the_full_maps_by_tiles(tmp_path, kind):
    """At a length of several tiles the maps are computed tile by tile: stored full they are the dense weights;
    pooled, the full maps summed over key blocks and averaged over query blocks (rows still distributions); as rows,
    the full maps' rows at evenly spaced queries. Entropy (of the true rows) and the logit profile agree across forms,
    and the analysis reads each form as it is stored."""
    from analysis.load import iter_maps, load_profiles, load_stats
    from trainer.model.position import pe_config_class

    torch.manual_seed(3)
    args = load_model_args("tiny")
    args.pe, args.attention_block = pe_config_class(kind)(kind=kind), 16
    model = Llama(args).eval()
    tokens = torch.randint(0, 259, (2, 96), generator=torch.Generator().manual_seed(4))
    ids = DumpIds("r1", "abc", 5, encoding_identity(model.args.pe))
    out = {}
    for form, extra in (("full", {}), ("pooled", {"pool": 8}), ("rows", {"rows": 10})):
        cfg = DumpConfig(samples=2, heads=[0, 1], form=form, **extra)
        attn, prof = dump_attention(model, tokens, cfg, ids, tmp_path / form)
        stats, (frame, maps) = load_stats(attn), next(iter_maps(attn, layers=[1]))
        out[form] = (stats, frame, maps, load_profiles(prof))
    full = out["full"][2]  # (samples × heads, 96, 96) of layer 1, fp16
    cap = {}
    model(tokens[:1], capture=cap)
    from trainer.model.attention.dense import dense_weights

    want = dense_weights(model.pe, cap[1])[0, :2].detach().double().numpy()
    np.testing.assert_allclose(full[:2], want, atol=2e-3)  # the tiles' maps are the dense ones (fp16)
    pooled = out["pooled"][2]
    assert pooled.shape == (4, 12, 12) and set(out["pooled"][1]["pool"]) == {8}
    np.testing.assert_allclose(pooled, full.reshape(4, 12, 8, 12, 8).sum(-1).mean(-2), atol=2e-3)
    np.testing.assert_allclose(pooled.sum(-1), 1.0, atol=1e-2)
    rows, frame = out["rows"][2], out["rows"][1]
    chosen = list(frame["query_rows"].iloc[0])
    assert rows.shape == (4, 10, 96) and chosen[0] == 0 and chosen[-1] == 95
    np.testing.assert_allclose(rows, full[:, chosen], atol=2e-3)
    entropy = {form: out[form][0].sort_values(["layer", "sample", "head"])["entropy"].to_numpy() for form in out}
    np.testing.assert_allclose(entropy["pooled"], entropy["full"], rtol=1e-4)
    assert out["rows"][0]["erank"].isna().all() and out["pooled"][0]["erank"].notna().all()
    for form in ("pooled", "rows"):
        np.testing.assert_allclose(np.stack(out[form][3]["logit_mean"]), np.stack(out["full"][3]["logit_mean"]),
                                   rtol=1e-5, atol=1e-5)
    import pandas as pd

    from analysis.load import same_dump_form

    with pytest.raises(UserError, match=r"ranks: the attention dumps differ in form or length \(full \(pool 1\) at "
                                        r"96 tokens; pooled \(pool 8\) at 96 tokens\)"):
        same_dump_form(pd.concat([out["full"][0], out["pooled"][0]]), "ranks")


def test_dump_over_budget_is_refused_before_computing(tmp_path):
    cfg = DumpConfig(samples=64, seq_len=1024, byte_budget=2**20)
    with pytest.raises(UserError, match=r"dump.samples, dump.seq_len, dump.layers or dump.heads"):
        tokens = torch.zeros(64, 1024, dtype=torch.long)
        dump_attention(_model(), tokens, cfg, DumpIds("r", "h", 0, encoding_identity(PEConfig())), tmp_path)
    assert not (tmp_path / "attention.parquet").exists()


def test_training_run_writes_dumps(tiny_cfg):
    r = train(tiny_cfg("train.steps=2", "dump.enabled=true", "dump.layers=[1]", "eval.passkey.enabled=false"))
    t = pq.read_table(r.artifacts["attention"], columns=["config_hash", "layer", "step", "seq_len"])
    assert set(t.column("layer").to_pylist()) == {1} and t.column("step")[0].as_py() == 2
    assert t.column("config_hash")[0].as_py() == r.config_hash and t.column("seq_len")[0].as_py() == 64


def test_effective_rank_known_answers():
    eye = torch.eye(16)
    assert effective_rank(eye) == pytest.approx(16)
    assert effective_rank(torch.ones(16, 16) / 16) == pytest.approx(1, abs=1e-6)
    assert effective_rank(eye, "stable") == pytest.approx(16)
    assert effective_rank(eye, "participation") == pytest.approx(16)
    uniform = torch.tril(torch.ones(8, 8)) / torch.arange(1, 9).unsqueeze(1)
    assert row_entropy(uniform) == pytest.approx(np.mean(np.log(np.arange(1, 9))))
    with pytest.raises(ValueError, match="kind='svd'"):
        effective_rank(eye, "svd")


@pytest.mark.parametrize("pe", [dict(kind="rope"), dict(kind="hdrope", rotation_dim=8, basis="random")])
def test_kv_cache_decoding_matches_full_forward(pe):
    model = _model(**pe)
    tokens = torch.randint(0, 259, (1, 30))
    full = model(tokens)
    cache = KVCache(model.args.n_layers)
    model(tokens[:, :20], cache=cache)
    chunk = model(tokens[:, 20:27], cache=cache)  # several queries at once: bottom-right causal mask
    step = model(tokens[:, 27:28], cache=cache)
    torch.testing.assert_close(chunk, full[:, 20:27], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(step[:, 0], full[:, 27], atol=1e-5, rtol=1e-4)
    gen = greedy_generate(model, tokens[0, :10].tolist(), 5)
    seq = tokens[0, :10].tolist()
    for _ in range(5):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    assert gen == seq[10:]


def test_passkey_prompts_hit_length_and_depth():
    tok = ByteTokenizer()
    p = PasskeyPrompter(tok, PasskeyFormat(header=""))
    for length in (256, 512, 1024):
        for depth in (0.0, 0.5, 1.0):
            pr = p.build(length, depth, 31337)
            total = len(pr.prompt) + len(pr.answer)
            assert length - 30 < total <= length  # within one filler sentence of the target
            text = tok.decode(pr.prompt)
            key, question = " The pass key is 31337. Remember it. 31337 is the pass key.", " What is the pass key?"
            before, after = text.index(key), text.index(question) - text.index(key) - len(key)
            assert pr.depth == before / (before + after)  # the fraction of filler (bytes = tokens) before the key
            assert abs(pr.depth - depth) <= max(map(len, p.units)) / (before + after)  # within one filler sentence
            assert "The pass key is 31337. Remember it. 31337 is the pass key." in text
            assert text.endswith("What is the pass key? The pass key is") and tok.decode(pr.answer) == " 31337"
    assert first_integer(" 4521. The") == "4521" and first_integer("none") is None
    with pytest.raises(UserError, match=r"shorten data\.passkey\.header"):
        PasskeyPrompter(tok, PasskeyFormat()).build(200, 0.5, 1)


def test_rope_matches_hf_llama_logits():
    from transformers import LlamaForCausalLM

    from trainer.export.hf_compat import hf_config, to_hf_state_dict

    torch.manual_seed(0)
    args = load_model_args("tiny", ["model.pe.kind=rope", "model.pe.theta=500000", "model.n_kv_heads=1"])
    ours = Llama(args).eval()
    hf = LlamaForCausalLM(hf_config(args, attn_implementation="eager")).eval()
    hf.load_state_dict(to_hf_state_dict(ours), strict=True)
    x = torch.randint(0, 259, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="only unscaled `rope`"):
        hf_config(load_model_args("tiny"))
