import numpy as np
import pytest
import torch

from hdrope import mixing_basis
from hdrope.errors import UserError
from trainer.model.llama import Llama, ModelArgs
from trainer.model.position import PEConfig, build_position_encoding
from trainer.presets import available_presets, load_model_args


def tiny(**pe) -> ModelArgs:
    args = load_model_args("tiny")
    for k, v in pe.items():
        setattr(args.pe, k, v)
    return args


@pytest.mark.parametrize("name,target", [("650m", 650e6), ("1.3b", 1.3e9)])
def test_paper_presets_on_meta_device_match_their_names(name, target):
    with torch.device("meta"):
        model = Llama(load_model_args(name))
    assert abs(model.num_params() - target) / target < 0.10
    a = model.args
    assert a.resolved_head_dim == 64


def test_presets_shipped():
    assert {"tiny", "compact", "650m", "1.3b"} <= set(available_presets())


def test_tiny_preset_is_about_100k_params_and_trains_a_step():
    torch.manual_seed(42)
    model = Llama(load_model_args("tiny"))
    assert 50_000 < model.num_params() < 200_000
    tokens = torch.randint(0, 259, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, 259)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 259), tokens[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - np.log(259)) < 0.5  # ~uniform at init
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_causal():
    model = Llama(load_model_args("tiny")).eval()
    a = torch.randint(0, 259, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 259
    torch.testing.assert_close(model(a)[:, :10], model(b)[:, :10])
    assert not torch.allclose(model(a)[:, 10:], model(b)[:, 10:])


def _block_diag_q(q: np.ndarray, head_dim: int) -> torch.Tensor:
    n = q.shape[0]
    b = head_dim // n
    full = np.zeros((head_dim, head_dim))
    idx = np.arange(n) * b
    for j in range(b):
        full[np.ix_(idx + j, idx + j)] = q
    return torch.from_numpy(full).float()


@pytest.mark.parametrize("rotation_dim", [4, 8, 32])
def test_basis_is_a_reparameterisation_of_wq_wk(rotation_dim):
    """NOTES §2: a Paley model equals a Q = I model with W_q, W_k rows premultiplied by blockdiag Qᵀ."""
    torch.manual_seed(0)
    paley = Llama(tiny(rotation_dim=rotation_dim, basis="paley")).eval()
    ident = Llama(tiny(rotation_dim=rotation_dim, basis="identity")).eval()
    ident.load_state_dict(paley.state_dict())
    hd = paley.args.resolved_head_dim
    qt = _block_diag_q(mixing_basis("paley", rotation_dim), hd).T
    with torch.no_grad():
        for layer in ident.layers:
            for w in (layer.attention.wq, layer.attention.wk):
                heads = w.weight.view(-1, hd, w.weight.shape[1])
                w.weight.copy_(torch.einsum("ij,hjk->hik", qt, heads).reshape_as(w.weight))
    tokens = torch.randint(0, 259, (2, 24))
    torch.testing.assert_close(paley(tokens), ident(tokens), atol=2e-5, rtol=1e-4)
    # and without the fold they differ: the basis is not a no-op
    ident.load_state_dict(paley.state_dict())
    assert not torch.allclose(paley(tokens), ident(tokens), atol=1e-3)


def test_rope_kind_equals_hdrope_rotation_dim_2_identity():
    torch.manual_seed(1)
    a = Llama(tiny(kind="rope")).eval()
    b = Llama(tiny(kind="hdrope", rotation_dim=2, basis="identity")).eval()
    b.load_state_dict(a.state_dict())
    t = torch.randint(0, 259, (1, 20))
    torch.testing.assert_close(a(t), b(t), atol=0, rtol=0)


def test_nope_ignores_position_offsets_and_rope_does_not():
    t = torch.randint(0, 259, (1, 12))
    nope = Llama(tiny(kind="nope")).eval()
    torch.testing.assert_close(nope(t), nope(t, torch.arange(12) + 100))
    rope = Llama(tiny(kind="rope")).eval()
    # relative encoding: a constant offset leaves logits unchanged up to rounding
    torch.testing.assert_close(rope(t), rope(t, torch.arange(12) + 100), atol=1e-5, rtol=1e-4)


def test_init_std_and_tied_embeddings():
    torch.manual_seed(42)
    args = load_model_args("compact", ["model.tie_embeddings=true"])
    model = Llama(args)
    assert model.output.weight is model.tok_embeddings.weight
    assert model.layers[0].attention.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = Llama(load_model_args("compact", ["model.depth_scaled_init=true"]))
    assert scaled.layers[0].attention.wo.weight.std().item() == pytest.approx(0.02 / np.sqrt(8), rel=0.05)


@pytest.mark.parametrize(
    "preset,overrides,match",
    [
        ("compact", ["model.pe.rotation_dim=6"], "rotation_dim=6 does not divide head_dim=64"),
        ("compact", ["model.n_kv_heads=3"], "n_heads=4 is not divisible by model.n_kv_heads=3"),
        ("compact", ["model.pe.kind=t5"], "pe.kind='t5' is unknown"),
        ("compact", ["model.pe.basis=qr"], "unknown basis"),
        ("compact", ["model.pe.theta=0.5"], "theta must be > 1"),
        ("compact", ["model.pe.rotation_dim=16", "model.pe.basis=paley"], "14 or 18"),
        ("compact", ["model.widht=3"], "widht"),
        ("compact", ["model.dim=abc"], "model.dim"),
        ("gigantic", [], "unknown preset 'gigantic'"),
        ("../etc/passwd", [], "not a plain name"),
        ("missing.yaml", [], "does not exist"),
    ],
)
def test_bad_model_config_errors_name_the_field(preset, overrides, match):
    with pytest.raises(UserError, match=match):
        load_model_args(preset, overrides)


def test_default_encoding_is_the_papers_algorithm_2():
    from test_rotary import algorithm2  # the paper's Algorithm 2 as printed

    enc = build_position_encoding(PEConfig(), 64)  # what a run gets when it says nothing
    q, k = torch.randn(2, 2, 16, 64, dtype=torch.float64), torch.randn(2, 2, 16, 64, dtype=torch.float64)
    positions = torch.arange(16)
    rq, rk = enc.rotate(q, k, enc.tables(positions, torch.float64))
    torch.testing.assert_close(rq, algorithm2(q, positions, PEConfig().theta))
    torch.testing.assert_close(rk, algorithm2(k, positions, PEConfig().theta))


@pytest.mark.parametrize("kind", ["hdrope", "rope", "fope", "xpos", "p_rope", "learned_basis", "rpe3d", "alibi",
                                  "liere", "comrope", "string", "rope_mixed", "pope", "hope"])
def test_a_forward_reads_no_scalar_back_from_the_device(monkeypatch, kind):
    # On a GPU every .item() stalls the stream; the model knows its positions' bound, so the cached tables grow
    # (here to 3x the train length) without reading the positions tensor.
    from trainer.presets import load_config

    cfg = load_config("tiny", [f"model.pe.kind={kind}"])
    model = Llama(cfg.model).eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (1, 3 * cfg.model.max_seq_len))

    def no_sync(self):
        raise AssertionError("Tensor.item() called in the forward pass")

    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    with torch.no_grad():
        assert torch.isfinite(model(tokens)).all()
