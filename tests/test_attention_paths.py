"""The attention paths (issue 45): every registered kind on every path that serves it equals the dense reference in
its values and every gradient, with document masks, sliding windows and a KV cache; packed documents equal the same
documents run one by one; a windowed cache keeps only what its queries can see; the mask is what it says."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hdrope.errors import UserError
from trainer.model.attention.call import AttentionCall, AttentionMask
from trainer.model.attention.dense import dense_logits
from trainer.model.attention.documents import Documents
from trainer.model.attention.flex import flex_refusal, mask_mod
from trainer.model.attention.paths import choose_path, path_problem
from trainer.model.attention.tiled import block_edges, tiled_attention
from trainer.model.llama import KVCache, Llama, ModelArgs
from trainer.model.position import POSITION_ENCODINGS, pe_config_class

EOS = 5
KINDS = sorted(POSITION_ENCODINGS)


def _model(kind: str, dtype: torch.dtype = torch.float64, **args) -> Llama:
    """A tiny two-layer model of `kind` whose encoding's parameters are moved off their initial values."""
    args = {"n_layers": 2, **args}
    torch.manual_seed(0)
    model = Llama(ModelArgs(vocab_size=32, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=32,
                            pe=pe_config_class(kind)(kind=kind), **args)).to(dtype)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.pe.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _tokens(batch: int = 2, seq: int = 23) -> torch.Tensor:
    tokens = torch.randint(6, 32, (batch, seq), generator=torch.Generator().manual_seed(3))
    tokens[0, 7] = tokens[0, 16] = EOS  # documents of 8, 9 and 6 tokens in row 0; of 16 and 7 in row 1
    if batch > 1:
        tokens[1, 15] = EOS
    return tokens


def _run(model: Llama, path: str, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.args.attention = path
    model.zero_grad()
    out = model(tokens)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# the bias kinds compute their bias in float32 (as their official code), so their gradients agree to that
GRAD_TOL = {"fire": 5e-7, "kerple": 5e-7, "dape": 5e-7, "t5_bias": 5e-7, "string": 5e-8}
MASKS = {"causal": ({}, None), "documents and a window": ({"window": 6, "layer_pattern": "1 local, 1 global"},
                                                          Documents(EOS, True))}


@pytest.mark.parametrize("masks", list(MASKS))
@pytest.mark.parametrize("kind", KINDS)
def test_the_tiled_path_equals_dense_in_values_gradients_and_with_a_kv_cache(kind, masks):
    fields, documents = MASKS[masks]
    model = _model(kind, attention_block=5, **fields)
    model.documents = documents
    tokens = _tokens()
    want, want_grads = _run(model, "dense", tokens)
    got, got_grads = _run(model, "tiled", tokens)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert set(got_grads) == set(want_grads)
    tol = GRAD_TOL.get(kind, 1e-12)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=tol, rtol=tol, msg=name)
    with torch.no_grad():  # a prefill, then chunks of four: queries after a cached prefix, tiles across the cut
        cache = KVCache(2)
        steps = [model(tokens[:, :9], cache=cache)] + [model(tokens[:, i:i + 4], cache=cache) for i in range(9, 23, 4)]
        model.args.attention = "dense"
        full = model(tokens)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-7 if kind in GRAD_TOL else 1e-10, rtol=0)


FLEX_KINDS = [k for k in KINDS if flex_refusal(type(_model(k).pe).scores_kind(), "cpu", False) is None]


def test_flex_serves_the_kinds_of_a_score_mod_and_refuses_the_rest():
    assert {"rope", "alibi", "kerple", "t5_bias", "fire", "fox", "grape_a", "pope"} <= set(FLEX_KINDS)
    assert not {"dape", "cope", "stickbreaking", "path"} & set(FLEX_KINDS)
    assert "FlexAttention takes a score_mod" in path_problem("flex", "own", "cuda", True)
    assert "no backward on cpu" in path_problem("flex", "flex-bias", "cpu", True)
    assert path_problem("flex", "flex-bias", "cuda", True) is None and path_problem("tiled", "own", "cpu", True) is None


@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_flex_equals_dense_forward_and_its_score_mod_has_the_dense_gradients(kind):
    """FlexAttention's eager reference on CPU (forward only in torch 2.13) over the kind's score_mod and the block
    mask; the score_mod and mask_mod, evaluated on the whole score matrix at broadcast indices, give the dense
    logits and their gradients (what the compiled kernel differentiates on CUDA)."""
    model = _model(kind, torch.float32, window=6, layer_pattern="1 local, 1 global")
    model.documents = Documents(EOS, True)
    tokens = _tokens()
    with torch.no_grad():
        model.args.attention = "dense"
        want = model(tokens)
        model.args.attention = "flex"
        got = model(tokens)
        cache = KVCache(2)
        steps = [model(tokens[:, :9], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(9, 23)]
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, atol=2e-6, rtol=0)
    model = model.double()
    capture = {}
    model.args.attention = "dense"
    model(tokens, capture=capture)
    call = capture[0]  # the local layer: documents and the window
    q, k = (t.detach().requires_grad_() for t in (call.q, call.k))
    call = AttentionCall(q, k, call.v, call.q_pos, call.k_pos, call.mask, call.state, call.layer)
    b, h, s, d = q.shape
    index = [torch.arange(n).view(*([1] * i), n, *([1] * (3 - i))) for i, n in enumerate((b, h, s, k.shape[-2]))]
    kv = k.shape[1]  # grouped-query attention: h query heads (RoPE++: its real and imaginary ones) over kv
    raw = (q.view(b, kv, h // kv, s, d) @ k[:, :, None].transpose(-1, -2)).view(b, h, s, -1) * model.pe.softmax_scale(d)
    score_mod = model.pe.score_mod(call, model.pe.prepare(call, 0)) or (lambda score, *idx: score)
    flex = score_mod(raw, *index).masked_fill(~mask_mod(call.mask)(*index), float("-inf"))
    dense = dense_logits(model.pe, call)
    torch.testing.assert_close(flex, dense, atol=1e-6, rtol=0)
    visible = torch.isfinite(dense)
    grads = [torch.autograd.grad(x[visible].square().sum(), [q, k, *model.pe.parameters()], allow_unused=True,
                                 retain_graph=True) for x in (flex, dense)]
    tol = 50 * GRAD_TOL.get(kind, 2e-8)  # the float32 biases' rounding, in sums over every visible pair
    for a, b_ in zip(*grads, strict=True):
        assert (a is None) == (b_ is None)
        if a is not None:
            torch.testing.assert_close(a, b_, atol=tol, rtol=tol)


@pytest.mark.parametrize("path", ["dense", "tiled"])
@pytest.mark.parametrize("kind", KINDS)
def test_packed_documents_equal_the_documents_run_one_by_one(kind, path):
    model = _model(kind, attention_block=4)
    model.args.attention = path
    tokens = _tokens(batch=1)
    with torch.no_grad():
        model.documents = Documents(EOS, True)
        packed = model(tokens)
        model.documents = None
        alone = [model(tokens[:, a:b]) for a, b in ((0, 8), (8, 17), (17, 23))]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1), atol=1e-7 if kind in GRAD_TOL else 1e-10, rtol=0)


def test_documents_restart_positions_and_continue_them_through_a_cache():
    tokens = _tokens()
    segments, positions, after = Documents(EOS, True).split(tokens, 0, None)
    assert segments[0].tolist() == [0] * 8 + [1] * 9 + [2] * 6 and segments[1].tolist() == [0] * 16 + [1] * 7
    assert positions[0].tolist() == [*range(8), *range(9), *range(6)]
    before = Documents(EOS).split(tokens[:, :17], 0, None)[2]
    again, positions, _ = Documents(EOS, True).split(tokens[:, 17:], 17, before)
    torch.testing.assert_close(again, segments[:, 17:])
    assert positions[1].tolist() == [1, 2, 3, 4, 5, 6]  # row 1's second document began at 16
    assert Documents(EOS, False).split(tokens, 0, None)[1] is None and after.start.tolist() == [17, 16]


@pytest.mark.parametrize("kind", ["rope", "fox", "path", "stickbreaking"])
def test_a_windowed_kv_cache_holds_only_what_its_next_queries_see(kind):
    model = _model(kind, window=4, layer_pattern="1 local, 1 global")
    tokens = _tokens(batch=2)
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(2)
        steps = [model(tokens[:, :6], cache=cache)]
        for i in range(6, 23):
            steps.append(model(tokens[:, i:i + 1], cache=cache))
            reach = model.pe.state_reach
            assert cache.kv[0][0].shape[2] == 3 + reach and cache.starts[0] == i + 1 - 3 - reach  # the local layer
            assert cache.kv[1][0].shape[2] == i + 1  # the global one keeps every key
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)


def test_the_mask_is_causal_windowed_and_within_documents_by_definition():
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]])
    for q_index, k_index, window in ((0, 0, 0), (0, 0, 3), (6, 2, 0), (6, 2, 2)):
        mask = AttentionMask(q_index, k_index, window, segments[:, k_index:])
        s, n = 10 - q_index, 10 - k_index
        got = mask.visible(0, s, 0, n, torch.device("cpu"))
        for b in range(2):
            for i in range(s):
                for j in range(n):
                    qi, kj = q_index + i, k_index + j
                    want = kj <= qi and (not window or qi - kj < window) and segments[b, qi] == segments[b, kj]
                    assert bool(got[b, 0, i, j]) == want
        rows = list(range(s))
        lows = mask.first_keys(rows)
        for i, low in zip(rows, lows, strict=True):
            assert not got[:, 0, i, :low].any() and (low == n or got[:, 0, i, low:].any())
    assert AttentionMask(5, 0).visible(0, 1, 0, 6, torch.device("cpu")) is None  # a decode step sees every key


def test_blocks_are_cut_at_multiples_of_the_block_size():
    assert block_edges(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert block_edges(6, 7, 4) == [(0, 2), (2, 6), (6, 7)]  # token indices 6-7, 8-11, 12
    assert block_edges(8, 4, 4) == [(0, 4)]


def test_auto_takes_dense_within_one_tile_and_for_fused_plain_kinds_else_tiled_or_flex():
    assert choose_path("auto", "plain", "cpu", True, 8192, 8192, True) == "dense"  # SDPA's flash kernel
    assert choose_path("auto", "plain", "cpu", True, 8192, 8192, True, fused=False) == "tiled"  # PoPE's wide q, k
    assert choose_path("auto", "plain", "cpu", True, 8192, 8192, False) == "tiled"  # a document mask
    assert choose_path("auto", "bias", "cpu", True, 256, 256, True) == "dense"
    assert choose_path("auto", "bias", "cpu", True, 257, 256, True) == "tiled"
    assert choose_path("auto", "flex-bias", "cuda", True, 8192, 8192, True) == "flex"
    assert choose_path("auto", "own", "cuda", True, 8192, 8192, True) == "tiled"
    assert choose_path("auto", "own", "cpu", False, 1, 32768, True) == "dense"  # a decode step
    assert choose_path("tiled", "plain", "cpu", True, 1, 1, True) == "tiled"


@pytest.mark.parametrize("kind", ["alibi", "fire", "cope", "dape", "stickbreaking", "path"])
def test_what_the_tiled_path_keeps_for_the_backward_grows_linearly(kind):
    """The bytes autograd keeps across the forward of one layer's attention at n and 2n tokens (each storage once: a
    block keeps references to the key tiles, not copies): about twice, where the dense path's grow about four
    times."""
    from trainer.model.attention.paths import run_attention

    model = _model(kind, torch.float32)

    def kept(n: int, path: str) -> int:
        x = torch.randn(1, n, 32, requires_grad=True)
        attn = model.layers[0].attention
        q = attn.wq(x).view(1, n, 4, 8).transpose(1, 2)
        k = attn.wk(x).view(1, n, 2, 8).transpose(1, 2)
        v = attn.wv(x).view(1, n, 2, 8).transpose(1, 2)
        pos = torch.arange(n)[None]
        q, k = model.pe.rotate(q, k, model.pe.tables(pos[0], q.dtype, n), 0)
        call = AttentionCall(q, k, v, pos, pos, AttentionMask(), model.pe.token_state(x, 0), 0)
        sizes: dict[int, int] = {}

        def keep(t: torch.Tensor) -> torch.Tensor:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            run_attention(model.pe, call, path, 32)
        return sum(sizes.values())

    tiled = [kept(n, "tiled") for n in (256, 512)]
    dense = [kept(n, "dense") for n in (256, 512)]
    assert tiled[1] / tiled[0] < 2.3 and dense[1] / dense[0] > 3.0


@pytest.mark.parametrize("positions", ["consecutive", "restarting"])
def test_the_generator_rotations_keep_no_rotation_per_position(positions):
    """LieRE's rotations exp(m·S) of a whole 64-channel head are never held per position (64² floats each, ten times
    a position's q and k: 33.5 MB at 2048 positions): what its rotation keeps for the backward is a few copies of q
    and k, and doubles with the length, for consecutive positions (the grid of powers) and restarting ones
    (gathered by chunks)."""
    from trainer.model.encodings.base import EncodingShape
    from trainer.model.position import build_position_encoding

    enc = build_position_encoding(pe_config_class("liere")(kind="liere"), EncodingShape(64, 4, 2, 1, 256))

    def kept(n: int) -> int:
        q, k = torch.randn(1, 4, n, 64, requires_grad=True), torch.randn(1, 2, n, 64, requires_grad=True)
        pos = torch.arange(n) if positions == "consecutive" else torch.arange(n).remainder(n // 2 + 3)[None]
        sizes: dict[int, int] = {}

        def keep(t: torch.Tensor) -> torch.Tensor:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        tables = enc.tables(pos, q.dtype, n)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            enc.rotate(q, k, tables, 0)
        return sum(sizes.values())

    small, large = kept(1024), kept(2048)
    assert large / small < 2.3
    assert large < 5 * (4 + 2) * 2048 * 64 * 4  # five times q and k's own bytes (15.7 MB)


def test_a_path_that_cannot_serve_the_run_is_refused_before_training(tiny_cfg):
    with pytest.raises(UserError, match=r"model\.attention='flex': FlexAttention has no backward on cpu.*use "
                                        r"model\.attention=auto or one of dense, tiled"):
        tiny_cfg("model.attention=flex", "model.pe.kind=alibi", "train.device=cpu")
    with pytest.raises(UserError, match=r"model\.attention='flex': FlexAttention takes a score_mod"):
        tiny_cfg("model.attention=flex", "model.pe.kind=dape", "train.device=cuda")
    with pytest.raises(UserError, match=r"model\.window=65: must be an integer in \[0, model\.max_seq_len=64\]"):
        tiny_cfg("model.window=65")
    with pytest.raises(UserError, match=r"model\.layer_pattern='3 local, 1 global' has local layers but "
                                        r"model\.window is 0"):
        tiny_cfg("model.layer_pattern=3 local, 1 global")
    with pytest.raises(UserError, match=r"model\.layer_pattern='2 locals': '2 locals' is not 'N local'"):
        tiny_cfg("model.layer_pattern=2 locals", "model.window=8")
    with pytest.raises(UserError, match=r"model\.attention='fast': choose one of auto, dense, tiled, flex"):
        tiny_cfg("model.attention=fast")
    with pytest.raises(UserError, match=r"data\.documents\.positions='reset': choose one of restart, continue"):
        tiny_cfg("data.documents.positions=reset")


def test_tiles_recompute_what_they_drop_with_exact_gradients_for_a_kind_with_a_carry():
    """CoPE counts positions through tiles (a carry), and recomputes each query block in the backward: the same
    gradients as one tile, whatever the block."""
    model = _model("cope")
    capture = {}
    model(_tokens(), capture=capture)
    call = capture[1]
    q = call.q.detach().requires_grad_()
    call = AttentionCall(q, call.k.detach(), call.v.detach(), call.q_pos, call.k_pos, call.mask, None, 1)
    grads = [torch.autograd.grad(F.softplus(tiled_attention(model.pe, call, block)).sum(), [q, model.pe.emb])
             for block in (3, 23)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_bench_length_prints_each_kinds_memory_and_step_time_against_ropes_side_by_side(hdrope_here, tmp_path):
    import json

    out = tmp_path / "length.json"
    done = hdrope_here(["bench", "length", "--preset", "tiny", "--lengths", "256", "512", "--kinds", "alibi", "fire",
                        "--rounds", "1", "--json", str(out)])
    assert done.returncode == 0, done.stderr
    assert "peak memory added by one training step" in done.stdout and "training step time" in done.stdout
    assert "length 512: done" in done.stderr  # progress per length
    res = json.loads(out.read_text())
    assert res["lengths"] == [256, 512] and {r["kind"] for r in res["rows"]} == {"rope", "alibi", "fire"}
    for r in res["rows"]:
        assert r["memory_mb"] > 0 and r["step_s"] > 0
        if r["kind"] == "rope":
            assert r["memory_vs_rope"] == r["step_vs_rope"] == r["mfu_vs_rope"] == 1.0
    # at 256 tokens (one tile) alibi takes the dense path and at 512 the tiled one: its memory ratio to RoPE falls
    alibi = {r["length"]: r["memory_vs_rope"] for r in res["rows"] if r["kind"] == "alibi"}
    assert alibi[512] < alibi[256]
    assert set(res["slopes"]) == {"rope", "alibi", "fire"}
    assert hdrope_here(["bench", "length", "--kinds", "nonsense", "--lengths", "64"]).returncode == 2
    # --update: fire re-measured apart (here its rows from a run made as `--kinds fire --json` would write them)
    apart = {**res, "rows": [{**r, "step_s": 9.0} for r in res["rows"] if r["kind"] in ("rope", "fire")],
             "slopes": {"rope": 1.0, "fire": 1.25}}
    (tmp_path / "fire.json").write_text(json.dumps(apart))
    done = hdrope_here(["bench", "length", "--update", str(out), "--measured", str(tmp_path / "fire.json")])
    assert done.returncode == 0, done.stderr
    merged = json.loads(out.read_text())
    assert [r for r in merged["rows"] if r["kind"] != "fire"] == [r for r in res["rows"] if r["kind"] != "fire"]
    assert [r["step_s"] for r in merged["rows"] if r["kind"] == "fire"] == [9.0, 9.0]
    assert merged["slopes"]["fire"] == 1.25 and merged["remeasured"][0]["kinds"] == ["fire"]
    (tmp_path / "short.json").write_text(json.dumps({**apart, "lengths": [256]}))
    refused = hdrope_here(["bench", "length", "--update", str(out), "--measured", str(tmp_path / "short.json")])
    assert refused.returncode == 2 and "its lengths is [256, 512], this run's [256]" in refused.stderr
    (tmp_path / "foreign.json").write_text(json.dumps({"rows": [], "preset": "tiny"}))
    refused = hdrope_here(["bench", "length", "--update", str(tmp_path / "foreign.json"), "--kinds", "fire"])
    assert refused.returncode == 2 and "field 'batch' is None, not an integer" in refused.stderr
    # --memory-alone: memory only, a process per kind, at a length past the bench's; the analysis reads it beside it
    from analysis.length_bench import MEMORY_ALONE_FILE, load_length_bench, memory_slopes

    done = hdrope_here(["bench", "length", "--memory-alone", "--preset", "tiny", "--lengths", "1024", "--kinds",
                        "alibi", "fire", "--json", str(tmp_path / MEMORY_ALONE_FILE)])
    assert done.returncode == 0, done.stderr
    (tmp_path / "bench.json").write_text(out.read_text())
    both = load_length_bench(tmp_path)
    assert set(both["memory_alone"][1024]) == {"rope", "alibi", "fire"}
    assert all(v > 0 for v in both["memory_alone"][1024].values())
    assert set(memory_slopes(both)) == {"rope", "alibi", "fire"} and memory_slopes(both) != both["slopes"]
