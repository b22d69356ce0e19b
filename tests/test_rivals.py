"""HD-RoPE's rotary rivals (issue 26): LieRE, ComRoPE, STRING, RoPE-Mixed, PoPE and HoPE, each against its own
formula, and the special cases that make RoPE and HD-RoPE members of their families, numerically."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.fold import fold_matrix
from trainer.model.encodings.base import EncodingShape
from trainer.model.position import (
    POSITION_ENCODINGS,
    build_position_encoding,
    encoding_flops,
    encoding_identity,
    pe_config_class,
)

RIVALS = ["liere", "comrope", "string", "rope_mixed", "pope", "hope"]
D = 16
SHAPE = EncodingShape(head_dim=D, n_heads=4, n_kv_heads=2, n_layers=2, max_seq_len=32)
POS = torch.arange(40)  # past the train length


def _enc(kind: str, shape: EncodingShape = SHAPE, **fields):
    return build_position_encoding(pe_config_class(kind)(kind=kind, **fields), shape)


def _rotate(enc, x: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """The encoding's transform of x (1, heads, len(POS), D) as queries, float64."""
    k = torch.zeros(1, SHAPE.n_kv_heads, x.shape[2], D, dtype=torch.float64)
    with torch.no_grad():
        out, _ = enc.rotate(x, k, enc.tables(POS, torch.float64), layer)
    return out


def _x() -> torch.Tensor:
    return torch.randn(1, SHAPE.n_heads, len(POS), D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def _hd(n: int, basis: str) -> HDRotary:
    return HDRotary(D, n, 10000.0, basis, seed=3)


def _reference(rot: HDRotary, x: torch.Tensor) -> torch.Tensor:
    """x turned by rot's explicit float64 matrix at every position of POS."""
    mats = torch.from_numpy(np.stack([rot.rotation_matrix(int(m)) for m in POS]))  # (len, D, D)
    return torch.einsum("sij,bhsj->bhsi", mats, x)


def _generator(rot: HDRotary) -> np.ndarray:
    """The (D × D) skew L with rot's rotation = exp(m·L): each channel's frequency times the block generator."""
    return np.diag(rot.frequencies[rot.layout.channel_frequency_index()]) @ rot.plan.generator


def _block_order(n: int) -> torch.Tensor:
    """Channel order that makes HD-RoPE's N-blocks (channels j, j + D/N, …) contiguous."""
    return torch.arange(D).reshape(n, D // n).T.reshape(-1)


# --- RoPE and HD-RoPE as special cases ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,basis", [(2, "identity"), (4, "paley"), (4, "random"), (8, "hadamard")])
def test_liere_with_hdrope_generators_is_hdrope_and_with_ropes_is_rope(n, basis):
    rot, x = _hd(n, basis), _x()
    enc = _enc("liere")  # one dense generator per head (the official default)
    # S = (L - 1)·L_HD, undoing LieRE's position scale 1/(L - 1); float64 parameters for an exact comparison
    enc.raw.data = torch.triu(torch.from_numpy(_generator(rot) * (SHAPE.max_seq_len - 1)), 1).expand_as(enc.raw).clone()
    torch.testing.assert_close(_rotate(enc, x), _reference(rot, x), atol=1e-9, rtol=0)


@pytest.mark.parametrize("variant", ["ap", "ld"])
@pytest.mark.parametrize("n,basis", [(2, "identity"), (4, "paley"), (8, "random")])
def test_comrope_with_hdrope_blocks_is_hdrope_in_block_order(variant, n, basis):
    """ComRoPE's contiguous blocks hold HD-RoPE's N-blocks (RoPE's pairs at N = 2) once the channels are put in
    block order: both AP and LD contain HD-RoPE at block_dim = N."""
    rot, x = _hd(n, basis), _x()
    enc = _enc("comrope", variant=variant, block_dim=n)
    order = _block_order(n)
    blocks = torch.from_numpy(_generator(rot))[order][:, order] * SHAPE.max_seq_len  # undo the 1/L scale
    blocks = torch.stack([blocks[i * n:(i + 1) * n, i * n:(i + 1) * n] for i in range(D // n)])
    if variant == "ap":  # float64 parameters for an exact comparison
        enc.angles.data = (blocks / 2).expand_as(enc.angles).clone()  # F - Fᵀ = blocks
    else:  # μ_b = |θ_b|·L, F_b = K/2
        scale = blocks.flatten(1).abs().amax(1)
        enc.angles.data = (blocks / scale[:, None, None] / 2).expand_as(enc.angles).clone()
        enc.multiplier.data = scale.reshape(1, 1, -1, 1, 1).expand_as(enc.multiplier).clone()
    torch.testing.assert_close(_rotate(enc, x[..., order]), _reference(rot, x)[..., order], atol=1e-9, rtol=0)


def test_string_with_p_identity_is_rope():
    x = _x()
    enc = _enc("string")  # A = 0: P = I at the start
    torch.testing.assert_close(_rotate(enc, x, 1), _reference(_hd(2, "identity"), x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("n,basis", [(2, "paley"), (4, "paley"), (4, "random"), (8, "hadamard"), (16, "dct")])
def test_hdrope_is_string_with_its_fold_matrix_as_p(n, basis, monkeypatch):
    """R_N(m) = Q·R_pair(m)·Qᵀ per block: HD-RoPE is STRING around the identity-basis rotation, P = blockdiag(Q)."""
    rot, x = _hd(n, basis), _x()
    enc = _enc("string", rotation_dim=n)
    p = torch.from_numpy(fold_matrix(rot)).unsqueeze(0)
    monkeypatch.setattr(enc, "fold", lambda layer: p)  # P itself (Cayley reaches it when P has no -1 eigenvalue)
    torch.testing.assert_close(_rotate(enc, x), _reference(rot, x), atol=1e-12, rtol=0)


def test_hope_removing_no_frequency_is_rope_and_by_default_removes_the_slow_ones():
    x = _x()
    rope = _reference(_hd(2, "identity"), x)
    torch.testing.assert_close(_rotate(_enc("hope", train_len=10**6), x), rope, atol=1e-12, rtol=0)
    freqs = 10000.0 ** (-np.arange(D // 2) * 2 / D)
    kept = freqs >= 2 * math.pi / SHAPE.max_seq_len
    assert 0 < kept.sum() < D // 2  # the default (train_len = max_seq_len) removes some, keeps some
    enc = _enc("hope")
    np.testing.assert_array_equal(enc.phases.freqs.numpy(), np.where(kept, freqs, 0.0))
    slow = np.flatnonzero(~kept)
    out = _rotate(enc, x)
    for c in (slow, slow + D // 2):  # a removed pair passes unrotated at every position
        torch.testing.assert_close(out[..., c], x[..., c])


def test_rope_mixed_starts_at_rope_and_learns_a_frequency_per_layer_and_head():
    x = _x()
    enc = _enc("rope_mixed")
    torch.testing.assert_close(_rotate(enc, x, 1), _reference(_hd(2, "identity"), x), atol=1e-6, rtol=0)
    with torch.no_grad():
        enc.freqs[1, 1, 3] = 0.7  # KV head 1 of layer 1 serves query heads 2 and 3
    out = _rotate(enc, x, 1)
    angles = POS.double() * torch.tensor(0.7).double()  # the float32 parameter's value
    a, b = x[..., 3], x[..., 3 + D // 2]
    torch.testing.assert_close(out[0, 2:, :, 3], (a * torch.cos(angles) - b * torch.sin(angles))[0, 2:], atol=1e-6,
                               rtol=0)
    torch.testing.assert_close(out[0, :2], _rotate(_enc("rope_mixed"), x, 1)[0, :2])


# --- each kind against its own equations --------------------------------------------------------------------------

def test_liere_is_the_matrix_exponential_of_its_skew_generators_per_block():
    enc = _enc("liere", block_dim=4, per_layer=True, per_head=True, seed=2)
    x = _x()
    out = _rotate(enc, x, 1)
    raw = enc.raw[1].detach().double()  # (KV heads, blocks, 4, 4)
    upper = torch.triu(raw, diagonal=1)
    s = upper - upper.transpose(-1, -2)
    for head in (0, 3):
        for m in (0, 5, 39):
            r = torch.linalg.matrix_exp(m / (SHAPE.max_seq_len - 1) * s[head // 2])
            want = torch.einsum("nij,nj->ni", r, x[0, head, m].reshape(4, 4)).reshape(-1)
            torch.testing.assert_close(out[0, head, m], want, atol=1e-10, rtol=0)


def test_pope_logits_are_the_polar_formula():
    enc = _enc("pope")
    with torch.no_grad():
        enc.bias.uniform_(-7.0, 1.0)  # beyond [-2π, 0]: used clamped
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, SHAPE.n_heads, len(POS), D, dtype=torch.float64, generator=g)
    k = torch.randn(1, SHAPE.n_kv_heads, len(POS), D, dtype=torch.float64, generator=g)
    with torch.no_grad():
        rq, rk = enc.rotate(q, k, enc.tables(POS, torch.float64), 1)
    assert rq.shape[-1] == rk.shape[-1] == 2 * D and enc.softmax_scale(2 * D) == D**-0.5
    theta = 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)
    delta = enc.bias[1].detach().double().clamp(-2 * math.pi, 0)
    soft = torch.nn.functional.softplus
    for h, m, n in ((0, 9, 2), (3, 39, 0), (2, 7, 7)):
        want = (soft(q[0, h, m]) * soft(k[0, h // 2, n]) * torch.cos((m - n) * theta - delta[h])).sum() / math.sqrt(D)
        got = (rq[0, h, m] @ rk[0, h // 2, n]) * enc.softmax_scale(2 * D)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_string_is_rope_in_an_orthogonal_basis_per_layer_and_kv_head():
    enc = _enc("string", per_head=True)
    with torch.no_grad():
        enc.a.normal_(0, 0.3)
    x = _x()
    out = _rotate(enc, x, 1)
    s = enc.a[1].detach().double()
    s = s - s.transpose(-1, -2)
    eye = torch.eye(D, dtype=torch.float64)
    for head in (0, 3):
        p = torch.linalg.inv(eye - s[head // 2]) @ (eye + s[head // 2])
        torch.testing.assert_close(p @ p.T, eye)
        inner = _reference(_hd(2, "identity"), (x[:, head:head + 1] @ p))  # R(m)·Pᵀx for every m
        torch.testing.assert_close(out[:, head:head + 1], inner @ p.T, atol=1e-10, rtol=0)


def test_circulant_string_is_exp_of_a_skew_circulant_with_ropes_fastest_frequencies_at_the_start():
    enc = _enc("string", variant="circulant", per_head=True)
    spectrum = torch.linalg.eigvals(enc.generator(0)[0, 0]).imag.abs().sort().values
    rope = torch.from_numpy(10000.0 ** (-np.arange(D // 2 - 1) * 2 / D))
    want = torch.cat([torch.zeros(2, dtype=torch.float64), rope.repeat_interleave(2)]).sort().values
    torch.testing.assert_close(spectrum, want, atol=1e-6, rtol=0)
    with torch.no_grad():
        enc.c.normal_(0, 0.3)
    x = _x()
    out = _rotate(enc, x, 1)
    for head in (1, 2):
        c = enc.c[1, head // 2].detach().double()
        circ = torch.stack([torch.roll(c, i) for i in range(D)])  # row i is c shifted right by i: C[i, j] = c[j - i]
        for m in (0, 3, 39):
            r = torch.linalg.matrix_exp(m * (circ - circ.T))
            torch.testing.assert_close(out[0, head, m], r @ x[0, head, m], atol=1e-9, rtol=0)


def test_circulant_string_export_is_refused_with_its_reason():
    from trainer.export.hf_export import hf_rotary_map
    from trainer.presets import load_config

    with pytest.raises(UserError, match="variant='circulant' is not exportable to HF Llama: its frequencies are"):
        hf_rotary_map(load_config("tiny", ["model.pe.kind=string", "model.pe.variant=circulant"]).model)


# --- everything flows -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,fields", [("liere", {}), ("comrope", {}), ("string", {}),
                                         ("string", {"variant": "circulant"})])
def test_flops_are_what_the_transform_multiplies(kind, fields):
    """The kind's FLOPs per token (one layer) equal the matmul FLOPs its forward + backward adds per token."""
    shape = EncodingShape(head_dim=D, n_heads=4, n_kv_heads=2, n_layers=1, max_seq_len=32)
    enc = _enc(kind, shape, **fields)
    seq = 9  # ⌈√9⌉ = 3 divides it: the grid of powers needs no padding positions, which would add their FLOPs

    def flops(batch: int) -> int:
        q = torch.randn(batch, 4, seq, D, requires_grad=True)
        k = torch.randn(batch, 2, seq, D, requires_grad=True)
        tables = enc.tables(torch.arange(seq), torch.float32, seq)
        with FlopCounterMode(display=False) as counter:
            rq, rk = enc.rotate(q, k, tables, 0)
            (rq.sum() + rk.sum()).backward()
        return counter.get_total_flops()

    per_token = (flops(3) - flops(1)) / (2 * seq)  # what grows with the tokens (the tables do not)
    assert per_token == encoding_flops(pe_config_class(kind)(kind=kind, **fields), shape)


@pytest.mark.parametrize("overrides,expected", [
    (["model.pe.kind=liere", "model.pe.block_dim=5"], "model.pe.block_dim=5: the generator blocks must tile "
                                                      "head_dim=32; use 0 (the whole head) or a divisor >= 2"),
    (["model.pe.kind=liere", "model.pe.block_dim=1"], "model.pe.block_dim=1"),
    (["model.pe.kind=comrope", "model.pe.block_dim=0"], "model.pe.block_dim=0: the generator blocks must tile "
                                                        "head_dim=32; use a divisor >= 2 of 32"),
    (["model.pe.kind=comrope", "model.pe.variant=xy"], "model.pe.variant='xy': choose one of ['ap', 'ld']"),
    (["model.pe.kind=comrope", "model.pe.init_std=0"], "model.pe.init_std=0.0: must be a number > 0"),
    (["model.pe.kind=string", "model.pe.rotation_dim=3"], "model.pe.rotation_dim=3: must be an even integer >= 2 "
                                                          "dividing head_dim=32"),
    (["model.pe.kind=string", "model.pe.theta=1"], "model.pe (string): theta must be > 1"),
    (["model.pe.kind=string", "model.pe.variant=fourier"], "model.pe.variant='fourier': choose one of ['cayley', "
                                                           "'circulant']"),
    (["model.pe.kind=string", "model.pe.variant=circulant", "model.pe.rotation_dim=4"],
     "model.pe.variant='circulant' takes rotation_dim 2 (got 4)"),
    (["model.pe.kind=hope", "model.pe.train_len=-4"], "model.pe.train_len=-4: must be an integer >= 0"),
    (["model.pe.kind=rope_mixed", "model.pe.theta=0.5"], "model.pe.theta=0.5: must be a finite number > 1"),
    (["model.pe.kind=pope", "model.pe.theta=-1"], "model.pe.theta=-1"),
    (["model.pe.kind=pope", "model.pe.rotation_dim=4"], "model.pe.rotation_dim"),  # a key PoPE does not have
])
def test_bad_rival_settings_are_user_errors_naming_the_field(overrides, expected):
    from trainer.presets import load_config

    with pytest.raises(UserError) as err:
        load_config("tiny", overrides)
    assert expected in str(err.value)


def test_each_rival_has_a_readable_label_and_its_export_refusal_says_why():
    from trainer.model.position import check_exportable

    labels = {k: encoding_identity(pe_config_class(k)(kind=k))["pe_label"] for k in RIVALS}
    assert labels == {"liere": "LieRE", "comrope": "ComRoPE-AP b8", "string": "Cayley-STRING",
                      "rope_mixed": "RoPE-Mixed", "pope": "PoPE", "hope": "HoPE"}
    cfg = pe_config_class("liere")(kind="liere", block_dim=8, per_layer=True, per_head=True)
    assert encoding_identity(cfg)["pe_label"] == "LieRE b8 (per layer, per head)"
    assert encoding_identity(pe_config_class("string")(kind="string", variant="circulant"))["pe_label"] == (
        "Circulant-STRING")
    for kind in RIVALS:
        if kind == "string":
            check_exportable(pe_config_class(kind)(kind=kind))
            continue
        with pytest.raises(UserError, match=f"kind='{kind}' is not exportable to HF Llama: ") as err:
            check_exportable(pe_config_class(kind)(kind=kind))
        assert POSITION_ENCODINGS[kind].no_export in str(err.value)


def test_a_sweep_over_the_rivals_plans_one_run_per_kind(tmp_path):
    from sweeps.plan import make_plan
    from sweeps.spec import load_spec

    spec = tmp_path / "rivals.yaml"
    spec.write_text(f"name: r\nbase: tiny\nstorage: {tmp_path}\naxes:\n  model.pe.kind: {['rope', *RIVALS]}\n"
                    "  train.seed: [1, 2]\n".replace("'", ""))
    plan = make_plan(load_spec(spec))
    assert len(plan.cells) == len(plan.to_run) == 2 * (1 + len(RIVALS))  # no rival is taken for RoPE
    labels = {encoding_identity(c.config.model.pe)["pe_label"] for c in plan.to_run}
    assert len(labels) == 1 + len(RIVALS)


def test_the_encodings_bench_times_every_rival():
    from trainer.model.bench import run_encodings_bench

    rows = run_encodings_bench((1, 2, 16, 8), rounds=1)
    timed = {r["encoding"] for r in rows}
    for kind in RIVALS:
        label = encoding_identity(pe_config_class(kind)(kind=kind))["pe_label"]
        assert label in timed, label
    assert all(math.isfinite(r["fwdbwd_vs_rope"]) and r["fwd_vs_floor"] > 0 for r in rows)


@pytest.mark.parametrize("kind", [*RIVALS, "string model.pe.variant=circulant"])
def test_each_rival_trains_on_the_tiny_preset(tiny_cfg, kind):
    from trainer.run.loop import train

    kind, *extra = kind.split()
    cfg = tiny_cfg(f"model.pe.kind={kind}", *extra, "train.steps=3", "train.eval_every=0", "train.ckpt_every=0",
                   "eval.passkey.enabled=false", "eval.extrapolation_batches=0", out=kind)
    result = train(cfg)
    assert math.isfinite(result.metrics["val_loss"]) and math.isfinite(result.metrics["train_loss"])


@pytest.mark.parametrize("kind", ["liere", "comrope"])
def test_positions_per_batch_row_turn_each_row_as_its_own_positions(kind):
    enc = _enc(kind, **({"per_head": True, "block_dim": 4} if kind == "liere" else {}))
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 5, D, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 5, D, generator=g, dtype=torch.float64)
    rows = torch.stack([torch.arange(5), torch.arange(30, 35)])
    with torch.no_grad():
        both = enc.rotate(q, k, enc.tables(rows, torch.float64), 1)
        for r in range(2):
            one = enc.rotate(q[r:r + 1], k[r:r + 1], enc.tables(rows[r], torch.float64), 1)
            torch.testing.assert_close(both[0][r:r + 1], one[0])
            torch.testing.assert_close(both[1][r:r + 1], one[1])


def test_pope_attention_scales_its_2d_wide_logits_by_one_over_sqrt_head_dim():
    from trainer.model.llama import Llama, ModelArgs, _Context

    torch.manual_seed(0)
    model = Llama(ModelArgs(vocab_size=32, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16,
                            pe=pe_config_class("pope")()))
    attn, capture = model.layers[0].attention, {}
    h = model.layers[0].attention_norm(model.tok_embeddings(torch.randint(0, 32, (2, 9))))
    with torch.no_grad():
        ctx = _Context(None, capture, "auto", 0, torch.arange(9)[None], None, 0)
        out = attn(h, model.pe, model.pe.tables(torch.arange(9), h.dtype, 9), ctx)
        q, k = capture[0].q, capture[0].k
        assert q.shape[-1] == 2 * attn.head_dim
        v = attn.wv(h).view(2, 9, 2, attn.head_dim).transpose(1, 2).repeat_interleave(2, dim=1)
        logits = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(attn.head_dim)
        probs = logits.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        want = attn.wo((probs @ v).transpose(1, 2).reshape(2, 9, -1))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_sweep_of_the_rivals_trains_and_reports_each_under_its_label(sweep_trainer, short_sweep_spec):
    import pyarrow.parquet as pq

    from analysis.report import build_report

    plan = sweep_trainer(short_sweep_spec("rivals", 2, {"model.pe.kind": RIVALS}))
    results = pq.read_table(plan.root / "results.parquet").to_pandas()
    labels = {c.config.model.pe.kind: encoding_identity(c.config.model.pe)["pe_label"] for c in plan.to_run}
    assert dict(zip(results["pe_kind"], results["pe_label"], strict=True)) == labels and len(labels) == len(RIVALS)
    assert (results["status"] == "FINISHED").all()
    md = build_report(plan.root).read_text()
    for label in labels.values():
        assert f"| {label} |" in md, label
