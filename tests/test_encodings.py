"""The registered position encodings beyond RoPE/HD-RoPE/NoPE: partial RoPE, p-RoPE and ALiBi, each from its
formula, registered as a module of the model, translation-invariant where claimed, trainable, with its identity."""

import math

import pytest
import torch

from trainer.model import KVCache, Llama
from trainer.position import (
    POSITION_ENCODINGS,
    PEConfig,
    alibi_slopes,
    build_position_encoding,
    dedup_pe,
    encoding_identity,
)
from trainer.presets import load_config


def _rope_ref(x, pos, theta):
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def test_partial_rope_rotates_the_first_share_of_channels_neox_style():
    pe = build_position_encoding(PEConfig(kind="partial_rope", fraction=0.25, theta=1e4), 64)
    q = torch.randn(1, 2, 12, 64)
    pos = torch.arange(12) + 50
    out, _ = pe.rotate(q, q, pe.tables(pos, q.dtype))
    torch.testing.assert_close(out[..., :16], _rope_ref(q[..., :16], pos, 1e4), atol=1e-5, rtol=0)
    assert torch.equal(out[..., 16:], q[..., 16:])


def test_p_rope_keeps_the_fastest_share_of_frequencies_and_freezes_the_rest():
    pe = build_position_encoding(PEConfig(kind="p_rope", fraction=0.25, theta=1e4), 64)
    q = torch.randn(1, 2, 12, 64)
    pos = torch.arange(12) + 50
    out, _ = pe.rotate(q, q, pe.tables(pos, q.dtype))
    ref = _rope_ref(q, pos, 1e4)
    kept = [*range(8), *range(32, 40)]  # pairs 0..7 (the 8 fastest of 32) = channels i and i + 32
    frozen = [c for c in range(64) if c not in kept]
    torch.testing.assert_close(out[..., kept], ref[..., kept], atol=1e-5, rtol=0)
    assert torch.equal(out[..., frozen], q[..., frozen])


def test_alibi_slopes_and_bias_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -(h + 1) for h in range(8)]
    assert alibi_slopes(6).tolist() == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])
    pe = build_position_encoding(PEConfig(kind="alibi"), 16, n_heads=4)
    bias = pe.bias(torch.arange(5), torch.arange(5), torch.float32)
    assert bias.shape == (4, 5, 5) and bias[1, 4, 1].item() == pytest.approx(-(2 ** -4) * 3)


@pytest.mark.parametrize("kind", sorted(POSITION_ENCODINGS))
def test_scores_depend_only_on_relative_position_for_kinds_that_claim_it(kind):
    pe = build_position_encoding(PEConfig(kind=kind, rotation_dim=4, basis="paley", fraction=0.5), 32, 64, 2)
    q, k = torch.randn(1, 2, 1, 32, dtype=torch.float64), torch.randn(1, 2, 1, 32, dtype=torch.float64)

    def score(m: int, n: int) -> torch.Tensor:
        rq, _ = pe.rotate(q, q, pe.tables(torch.tensor([m]), q.dtype))
        _, rk = pe.rotate(k, k, pe.tables(torch.tensor([n]), k.dtype))
        s = (rq * rk).sum(-1)[0, :, 0]
        b = pe.bias(torch.tensor([m]), torch.tensor([n]), torch.float64)
        return s + (0 if b is None else b[:, 0, 0])

    assert pe.translation_invariant
    for m, n, t in [(7, 3, 100), (50, 2, 1000), (9, 9, 33)]:
        torch.testing.assert_close(score(m, n), score(m + t, n + t), atol=1e-9, rtol=0)


@pytest.mark.parametrize("kind", sorted(POSITION_ENCODINGS))
def test_every_kind_is_a_module_of_the_model_and_decodes_with_a_cache(kind):
    cfg = load_config("tiny", [f"model.pe.kind={kind}", "model.pe.fraction=0.5"])
    torch.manual_seed(0)
    model = Llama(cfg.model).eval()
    assert "pe" in dict(model.named_children()) and type(model.pe).__name__ in repr(model)
    x = torch.randint(0, 259, (1, 20))
    with torch.no_grad():
        full = model(x)
        cache = KVCache(cfg.model.n_layers)
        steps = [model(x[:, :12], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["partial_rope", "p_rope", "alibi"])
def test_each_new_kind_trains_and_writes_its_identity(kind, tiny_cfg):
    from trainer.loop import train
    from trainer.run_files import read_metrics

    cfg = tiny_cfg(f"model.pe.kind={kind}", "train.steps=30", "eval.passkey.enabled=false", "dump.enabled=true",
                   "dump.samples=1")
    result = train(cfg)
    losses = [r["train_loss"] for r in read_metrics(result.run_dir / "metrics.jsonl") if "train_loss" in r]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    ident = encoding_identity(cfg.model.pe)
    assert ident["pe_kind"] == kind and ident["pe_label"] in {"partial RoPE 0.25", "p-RoPE 0.25", "ALiBi"}
    import pyarrow.parquet as pq

    dump = pq.read_table(result.run_dir / "attention" / "attention.parquet", columns=["pe_label"]).to_pylist()
    assert {r["pe_label"] for r in dump} == {ident["pe_label"]}


def test_a_fraction_of_one_is_rope_for_dedup_and_bad_fractions_name_the_key():
    rope = dedup_pe(PEConfig(kind="rope", theta=1e4))
    assert dedup_pe(PEConfig(kind="partial_rope", fraction=1.0, theta=1e4)) == rope
    assert dedup_pe(PEConfig(kind="p_rope", fraction=1.0, theta=1e4)) == rope
    assert dedup_pe(PEConfig(kind="p_rope", fraction=0.5, theta=1e4)) != rope
    from hdrope.errors import UserError

    with pytest.raises(UserError, match=r"model.pe.fraction=1.5: must be in \(0, 1\]"):
        build_position_encoding(PEConfig(kind="p_rope", fraction=1.5), 64)
