"""NOTES §2: HD-RoPE with a fixed basis Q is the identity-basis model with folded W_q/W_k.

So under a rotation-invariant optimiser (SGD with momentum, L2 decay, norm clipping) the Paley model and
its folded identity twin train identically, step for step; under AdamW or Adafactor they part ways.
That difference is what the mechanism study (experiments/tables/mechanism_compact.yaml) measures.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hdrope import HDRotary
from hdrope.fold import fold_matrix, identity_twin
from trainer.model.llama import Llama
from trainer.run.optim import OPTIMIZERS, build_optimizer


@pytest.mark.parametrize("n", [2, 4, 8, 32])
@pytest.mark.parametrize("basis", ["paley", "random", "hadamard", "dct"])
def test_fold_matrix_conjugates_the_identity_encoding_into_the_basis_encoding(n, basis):
    rot = HDRotary(64, n, 10000.0, basis=basis, seed=5)
    b, ident = fold_matrix(rot), identity_twin(rot)
    assert np.allclose(b @ b.T, np.eye(64), atol=1e-12)
    for m in (0, 1, 17, 4096):
        assert np.allclose(rot.rotation_matrix(m), b @ ident.rotation_matrix(m) @ b.T, atol=1e-12)


def _folded_twin(model: Llama) -> Llama:
    """The identity-basis model computing exactly what `model` computes: W_q, W_k rows premultiplied by Bᵀ."""
    a = model.args
    twin = Llama(dataclasses.replace(a, pe=dataclasses.replace(a.pe, basis="identity")))
    twin.to(next(model.parameters()).dtype)
    rot = HDRotary(a.resolved_head_dim, a.pe.rotation_dim, a.pe.theta, basis=a.pe.basis, seed=a.pe.seed)
    bt = torch.from_numpy(fold_matrix(rot).T)
    state = model.state_dict()
    for name, w in state.items():
        if name.endswith(("attention.wq.weight", "attention.wk.weight")):
            heads = w.double().view(-1, a.resolved_head_dim, w.shape[-1])
            state[name] = torch.einsum("ij,hjk->hik", bt, heads).reshape(w.shape).to(w.dtype)
    twin.load_state_dict(state)
    return twin


def _loss_curve(model: Llama, cfg, steps: int = 12) -> list[float]:
    torch.manual_seed(0)
    opt = build_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, model.args.vocab_size, (4, model.args.max_seq_len + 1), generator=gen)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture
def paley_model(tiny_cfg):
    cfg = tiny_cfg("model.pe.rotation_dim=4", "model.pe.basis=paley")
    torch.manual_seed(42)
    return Llama(cfg.model).double(), cfg


def test_the_folded_identity_twin_computes_the_same_logits(paley_model):
    model, _ = paley_model
    twin = _folded_twin(model)
    tokens = torch.randint(0, model.args.vocab_size, (2, model.args.max_seq_len))
    assert torch.allclose(model(tokens), twin(tokens), atol=1e-10)
    assert not torch.allclose(model.layers[0].attention.wq.weight, twin.layers[0].attention.wq.weight)


def test_under_sgd_paley_and_its_folded_twin_follow_one_loss_curve_but_not_under_adamw(paley_model):
    model, cfg = paley_model
    sgd = dataclasses.replace(cfg.optim, name="sgd", lr=0.05, momentum=0.9, weight_decay=0.1, grad_clip=1.0)
    twin = _folded_twin(model)
    a, b = _loss_curve(model, sgd), _loss_curve(twin, sgd)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-9, (a, b)
    assert a[-1] < a[0]  # it trained

    torch.manual_seed(42)
    fresh = Llama(cfg.model).double()
    adamw = dataclasses.replace(cfg.optim, name="adamw", lr=3e-3)
    fresh_twin = _folded_twin(fresh)
    a, b = _loss_curve(fresh, adamw), _loss_curve(fresh_twin, adamw)
    assert abs(a[0] - b[0]) < 1e-9  # same function at step 0 ...
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) > 1e-6  # ... but AdamW is not rotation-invariant


def test_every_registered_optimizer_builds_and_steps(tiny_cfg):
    cfg = tiny_cfg()
    for name in OPTIMIZERS:
        model = Llama(cfg.model)
        losses = _loss_curve(model, dataclasses.replace(cfg.optim, name=name, lr=1e-2), steps=3)
        assert all(np.isfinite(losses)), name
