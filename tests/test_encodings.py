"""Position-encoding kinds: reference formulas, translation invariance, module registration, configs, training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hdrope import HDRotary
from hdrope.errors import UserError
from trainer.model.attention.call import AttentionCall, AttentionMask
from trainer.model.attention.dense import dense_logits
from trainer.model.encodings.alibi import ALiBiConfig, alibi_slopes
from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.fope import FoPEConfig, fope_frequencies, step_eye
from trainer.model.encodings.learned_basis import LearnedBasisConfig, orthogonal
from trainer.model.encodings.p_rope import PRoPEConfig
from trainer.model.encodings.partial_rope import PartialRoPEConfig
from trainer.model.encodings.rotary import PEConfig
from trainer.model.encodings.rpe3d import RPE3DConfig
from trainer.model.encodings.xpos import XPosConfig
from trainer.model.llama import KVCache, Llama, ModelArgs
from trainer.model.position import (
    POSITION_ENCODINGS,
    build_position_encoding,
    check_exportable,
    dedup_pe,
    encoding_identity,
    pe_config_class,
)
from trainer.presets import load_config, merge_config

D = 16  # head_dim of the unit tests
SHAPE = EncodingShape(head_dim=D, n_heads=4, n_kv_heads=2, n_layers=2, max_seq_len=32)


def _pairs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x[: len(x) // 2], x[len(x) // 2:]


def _rotate_ref(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Pairs (j, j + d/2) of a vector turned by the given angles (one per pair), written out."""
    a, b = _pairs(x)
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles), b * np.cos(angles) + a * np.sin(angles)])


def _apply(pe, x: torch.Tensor, p: int, layer: int = 0) -> np.ndarray:
    """The module's transform of one (heads, d) query at position p, as float64 numpy."""
    enc = build_position_encoding(pe, SHAPE)
    q = x.reshape(1, x.shape[0], 1, D).double()
    k = torch.zeros(1, SHAPE.n_kv_heads, 1, D, dtype=torch.float64)
    out, _ = enc.rotate(q, k, enc.tables(torch.tensor([p]), torch.float64), layer)
    return out[0, :, 0].detach().numpy()


ROPE_FREQ = 10000.0 ** (-np.arange(D // 2) * 2 / D)


def test_partial_rope_rotates_the_first_fraction_of_channels_neox_style():
    x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
    got = _apply(PartialRoPEConfig(fraction=0.5), x, 7)
    r = D // 2
    freqs = 10000.0 ** (-np.arange(r // 2) * 2 / r)
    for h in range(SHAPE.n_heads):
        xn = x[h].numpy()
        want = np.concatenate([_rotate_ref(xn[:r], 7 * freqs), xn[r:]])
        np.testing.assert_allclose(got[h], want, atol=1e-12)


def test_p_rope_keeps_the_highest_frequencies_and_zeroes_the_rest():
    x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
    got = _apply(PRoPEConfig(fraction=0.25), x, 5)
    freqs = ROPE_FREQ.copy()
    freqs[int(0.25 * D // 2):] = 0.0  # 2 of 8 kept: θ_0 = 1 and θ_1
    assert np.count_nonzero(freqs) == 2
    for h in range(SHAPE.n_heads):
        np.testing.assert_allclose(got[h], _rotate_ref(x[h].numpy(), 5 * freqs), atol=1e-12)


def test_xpos_is_rope_with_a_per_frequency_decay():
    x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
    got = _apply(XPosConfig(gamma=0.4, scale_base=64.0), x, 9)
    zeta = (np.arange(0, D, 2) + 0.4 * D) / (1.4 * D)
    scale = np.concatenate([zeta, zeta]) ** (9 / 64.0)
    for h in range(SHAPE.n_heads):
        np.testing.assert_allclose(got[h], _rotate_ref(x[h].numpy(), 9 * ROPE_FREQ) * scale, atol=1e-12)


def test_rpe3d_is_the_papers_chunked_rotation():
    x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
    c, base = 4, 100.0
    for p in (0, 3, 4, 9, 13):
        got = _apply(RPE3DConfig(chunk_size=c, phi_base=base), x, p)
        j, m = p // c, p % c
        phi = base ** (-j)
        for h in range(SHAPE.n_heads):
            a, b = _pairs(x[h].numpy())
            perp = np.concatenate([-b, a])  # h⊥ = (-h², h¹) on each pair
            mixed = np.cos(phi) * perp + np.sin(phi) * x[h].numpy()
            np.testing.assert_allclose(got[h], _rotate_ref(mixed, m * ROPE_FREQ), atol=1e-12)


def test_alibi_slopes_follow_the_reference_including_non_powers_of_two():
    np.testing.assert_allclose(alibi_slopes(8).numpy(), [2.0 ** -i for i in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes(6).numpy(), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_fope_sizes_and_step_eye_follow_the_official_defaults():
    assert fope_frequencies(10000.0, 64, 512).numel() == 16
    assert fope_frequencies(10000.0, 64, 1024).numel() == 18
    eye = step_eye(18, 16)  # step 2: ones at (0,0), (2,1), ..., (16,8); columns 9.. stay empty
    assert eye.sum() == 9 and eye[16, 8] == 1 and eye[:, 9:].sum() == 0
    assert torch.equal(step_eye(5, 5), torch.eye(5))


def test_fope_is_its_fourier_series_formula():
    pe = FoPEConfig(sigma=0.3, seed=3)
    enc = build_position_encoding(pe, SHAPE)
    freqs = fope_frequencies(10000.0, D, SHAPE.max_seq_len).numpy()
    d_in, d_out = len(freqs), min(len(freqs), D // 4)
    assert enc.w_sin.shape == (SHAPE.n_layers, SHAPE.n_kv_heads, d_in, d_out)
    x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
    for layer, p in ((0, 5), (1, 11)):
        got = _apply(pe, x, p, layer)
        for h in range(SHAPE.n_heads):
            g = h // (SHAPE.n_heads // SHAPE.n_kv_heads)
            ws, wc = enc.w_sin[layer, g].double().numpy(), enc.w_cos[layer, g].double().numpy()
            s = np.ones(D // 2)
            c = np.ones(D // 2)
            s[:d_out] = np.sin(p * freqs) @ ws
            c[:d_out] = np.cos(p * freqs) @ wc
            a, b = _pairs(x[h].numpy())
            want = np.concatenate([a * c - b * s, b * c + a * s])
            np.testing.assert_allclose(got[h], want, atol=1e-5)  # the coefficients are stored in float32


def test_fope_noise_has_the_xavier_std_and_is_saved_not_trained():
    shape = EncodingShape(head_dim=64, n_heads=8, n_kv_heads=8, n_layers=4, max_seq_len=512)
    enc = build_position_encoding(FoPEConfig(sigma=0.3), shape)
    noise = enc.w_sin - step_eye(16, 16)
    want = 0.3 * math.sqrt(2 / (16 * (16 + 8)))
    assert abs(noise.std().item() / want - 1) < 0.1
    assert not list(enc.parameters()) and {"w_sin", "w_cos"} <= set(enc.state_dict())
    learned = build_position_encoding(FoPEConfig(learnable=True), shape)
    assert {n for n, _ in learned.named_parameters()} == {"w_sin", "w_cos"}
    again = build_position_encoding(FoPEConfig(sigma=0.3), shape)
    assert torch.equal(again.w_sin, enc.w_sin)  # seeded by model.pe.seed, not by the global RNG


def test_learned_basis_starts_exactly_at_hdrope_with_its_basis():
    for init in ("identity", "paley", "random"):
        pe = LearnedBasisConfig(rotation_dim=4, init=init, seed=1)
        rot = HDRotary(D, 4, 10000.0, init, 1)
        x = torch.randn(SHAPE.n_heads, D, dtype=torch.float64)
        for p in (1, 6):
            got = _apply(pe, x, p)
            want = x.numpy() @ rot.rotation_matrix(p).T
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=init)


@pytest.mark.parametrize("how", ["expm", "cayley"])
def test_learned_basis_stays_exactly_orthogonal(how):
    a = torch.randn(3, 8, 8, dtype=torch.float64)
    q = orthogonal(a, how)
    torch.testing.assert_close(q @ q.transpose(-1, -2), torch.eye(8, dtype=torch.float64).expand(3, 8, 8))
    enc = build_position_encoding(LearnedBasisConfig(parameterisation=how, per_head=True), SHAPE)
    with torch.no_grad():
        enc.a.normal_()
    x = torch.randn(1, SHAPE.n_heads, 5, D, dtype=torch.float64)
    out, _ = enc.rotate(x, x[:, :2], enc.tables(torch.arange(5), torch.float64), 1)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def _scores(kind: str, m: int, n: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Logit of a query at position m on a key at n (per head), bias included, from the module."""
    pe = pe_config_class(kind)(kind=kind)
    enc = build_position_encoding(pe, SHAPE)
    if kind == "learned_basis":
        with torch.no_grad():
            enc.a.copy_(torch.randn(enc.a.shape, generator=torch.Generator().manual_seed(1)))
    if kind == "rpe3d":
        enc = build_position_encoding(RPE3DConfig(chunk_size=4, phi_base=3.0), SHAPE)
    if kind == "fire":  # below its threshold L, FIRE's normaliser is constant: shifts must cross L to show
        enc = build_position_encoding(pe_config_class("fire")(init_threshold=4.0), SHAPE)
    pos = torch.tensor([n, m])  # the key's token, then the query's
    rq, rk = enc.rotate(q.expand(1, -1, 2, -1), k.expand(1, -1, 2, -1), enc.tables(pos, torch.float64))
    x = torch.randn(1, 2, SHAPE.input_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    call = AttentionCall(rq[:, :, 1:], rk, rk, pos[None, 1:], pos[None], AttentionMask(1, 0),
                         enc.double().token_state(x, 1), 1)
    return dense_logits(enc, call)[0, :, 0, 0] / enc.softmax_scale(rq.shape[-1])


@pytest.mark.parametrize("kind", sorted(POSITION_ENCODINGS))
def test_translation_invariance_is_what_each_kind_claims(kind):
    torch.manual_seed(0)
    q = torch.randn(1, SHAPE.n_heads, 1, D, dtype=torch.float64)
    k = torch.randn(1, SHAPE.n_kv_heads, 1, D, dtype=torch.float64)
    base = _scores(kind, 7, 2, q, k)
    shifted = [_scores(kind, 7 + t, 2 + t, q, k) for t in (1, 5, 13)]
    invariant = all(torch.allclose(base, s, atol=1e-9) for s in shifted)
    assert invariant == POSITION_ENCODINGS[kind].invariant(pe_config_class(kind)(kind=kind))


def _tiny_args(kind: str, **fields) -> ModelArgs:
    return ModelArgs(vocab_size=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=32,
                     pe=pe_config_class(kind)(kind=kind, **fields))


@pytest.mark.parametrize("kind", sorted(POSITION_ENCODINGS))
def test_the_encoding_is_a_registered_module_and_decodes_with_a_kv_cache(kind):
    torch.manual_seed(0)
    model = Llama(_tiny_args(kind)).eval()
    assert "(pe):" in repr(model)
    assert not any("phases" in k or k.endswith((".cos", ".sin")) for k in model.state_dict())  # caches
    tokens = torch.randint(0, 32, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(2)
        steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", sorted(POSITION_ENCODINGS))
def test_every_kind_trains(kind):
    """A tiny model learns a periodic sequence with each encoding (loss falls well below its start)."""
    torch.manual_seed(0)
    extra = {"learnable": True} if kind == "fope" else {}
    model = Llama(_tiny_args(kind, **extra))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = (torch.arange(33).repeat(4, 1) * 3 + torch.arange(4)[:, None]) % 7
    losses = []
    for _ in range(40):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (kind, losses[0], losses[-1])
    if kind in ("learned_basis", "fope"):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.pe.parameters())


def test_checkpoint_state_holds_fixed_random_tensors_but_not_caches():
    model = Llama(_tiny_args("fope"))
    model(torch.zeros(1, 8, dtype=torch.long))
    keys = set(model.state_dict())
    assert {"pe.w_sin", "pe.w_cos"} <= keys and not any(k.startswith("pe.phases") for k in keys)
    assert "pe.a" in set(Llama(_tiny_args("learned_basis")).state_dict())


def test_only_rope_hdrope_and_string_are_exportable_and_the_rest_say_why():
    for kind in POSITION_ENCODINGS:
        pe = pe_config_class(kind)(kind=kind)
        if kind in ("rope", "hdrope", "string"):
            check_exportable(pe)
        else:
            with pytest.raises(UserError, match=f"kind='{kind}' is not exportable") as err:
                check_exportable(pe)
            assert POSITION_ENCODINGS[kind].no_export in str(err.value)


def test_each_kind_has_its_own_label_and_identity_columns():
    labels = {encoding_identity(pe_config_class(k)(kind=k))["pe_label"] for k in POSITION_ENCODINGS}
    assert len(labels) == len(POSITION_ENCODINGS)
    assert encoding_identity(ALiBiConfig())["theta"] is None
    assert dedup_pe(PartialRoPEConfig(fraction=1.0)) == dedup_pe(PEConfig(kind="rope"))
    assert dedup_pe(PRoPEConfig(fraction=1.0)) == dedup_pe(PEConfig(kind="rope"))
    assert dedup_pe(LearnedBasisConfig(seed=5)) == dedup_pe(LearnedBasisConfig(seed=0))
    assert dedup_pe(FoPEConfig(seed=5)) != dedup_pe(FoPEConfig(seed=0))


def test_the_kind_picks_its_typed_config_and_other_kinds_keys_are_errors():
    cfg = load_config("tiny", ["model.pe.kind=fope", "model.pe.sigma=0.4"])
    assert isinstance(cfg.model.pe, FoPEConfig) and cfg.model.pe.sigma == 0.4  # preset's rotation_dim dropped
    assert isinstance(load_config("tiny", ["model.pe.kind=rope"]).model.pe, PEConfig)
    with pytest.raises(UserError, match=r"model\.pe\.basis.*kind='fope' has the keys"):
        load_config("tiny", ["model.pe.kind=fope", "model.pe.basis=paley"])
    with pytest.raises(UserError, match=r"model\.pe\.chunk_size=0"):
        load_config("tiny", ["model.pe.kind=rpe3d", "model.pe.chunk_size=0"])
    with pytest.raises(UserError) as err:  # a key the kind has, with a bad value: no list of the kind's keys
        load_config("tiny", ["model.pe.seed=1e20"])
    assert "'model.pe.seed'" in str(err.value) and "has the keys" not in str(err.value)
    with pytest.raises(UserError, match=r"model\.pe\.fraction=1\.5"):
        load_config("tiny", ["model.pe.kind=partial_rope", "model.pe.fraction=1.5"])
    with pytest.raises(UserError, match=r"model\.pe\.init='qr'"):
        load_config("tiny", ["model.pe.kind=learned_basis", "model.pe.init=qr"])
    pe = merge_config([{"model": {"pe": {"kind": "xpos", "gamma": 0.5}}}]).model.pe
    assert pe == XPosConfig(gamma=0.5)


def test_a_sweep_over_kinds_plans_with_one_label_per_kind(tmp_path):
    from sweeps.plan import make_plan
    from sweeps.spec import load_spec

    spec = tmp_path / "kinds.yaml"
    kinds = sorted(POSITION_ENCODINGS)
    spec.write_text(f"name: k\nbase: tiny\nstorage: {tmp_path}\naxes:\n  model.pe.kind: {kinds}\n"
                    "  model.pe.theta: [1.0e4, 5.0e5]\n".replace("'", ""))
    with pytest.raises(UserError, match="theta"):  # nope and alibi have no theta: a clear error, not a silent cell
        make_plan(load_spec(spec))
    with_theta = [k for k in kinds if "theta" in pe_config_class(k).__dataclass_fields__]
    spec.write_text(f"name: k\nbase: tiny\nstorage: {tmp_path}\naxes:\n  model.pe.kind: {with_theta}\n"
                    "  model.pe.theta: [1.0e4, 5.0e5]\n".replace("'", ""))
    plan = make_plan(load_spec(spec))
    labels = {(encoding_identity(c.config.model.pe)["pe_label"], c.config.model.pe.theta) for c in plan.to_run}
    assert len(plan.cells) == 2 * len(with_theta)
    assert len(plan.to_run) == len(labels) == 2 * len(with_theta) - 1  # NoPE ignores θ: its two cells are one


@pytest.mark.parametrize("kind", ["fope", "alibi", "learned_basis", "pope"])
def test_a_tiny_run_of_a_new_kind_writes_its_identity_everywhere(tiny_cfg, kind):
    import pyarrow.parquet as pq

    from trainer.run.checkpoint import load_checkpoint
    from trainer.run.loop import train

    cfg = tiny_cfg(f"model.pe.kind={kind}", "train.steps=4", "train.eval_every=0", "train.ckpt_every=0",
                   "dump.enabled=true", "dump.samples=1", "eval.passkey.length_factors=[2.0]",
                   "eval.passkey.depths=1", out=kind)
    result = train(cfg)
    want = encoding_identity(cfg.model.pe)
    for table in (result.run_dir / "passkey.parquet", result.run_dir / "attention" / "attention.parquet"):
        rows = pq.read_table(table).to_pandas()
        assert set(rows["pe_label"]) == {want["pe_label"]} and set(rows["pe_kind"]) == {kind}
    assert math.isfinite(result.metrics["val_loss"])
    model = Llama(cfg.model)
    load_checkpoint(result.checkpoint, model)  # the encoding's tensors round-trip with the checkpoint
    trained = {k: v for k, v in model.state_dict().items() if k.startswith("pe.")}
    assert trained or kind == "alibi"
    if kind == "learned_basis":  # the optimizer saw the basis parameters and the checkpoint kept them
        assert model.pe.a.abs().sum() > 0


def test_a_sweep_over_new_kinds_runs_and_reports_one_label_per_kind(sweep_trainer, short_sweep_spec):
    """Plan, train, results.parquet and the report: every kind under its own label, from encoding_identity."""
    import pyarrow.parquet as pq

    from analysis.report import build_report

    spec = short_sweep_spec("newkinds", 4, {"model.pe.kind": ["rope", "rpe3d", "fope", "xpos", "alibi"]})
    plan = sweep_trainer(spec)
    results = pq.read_table(plan.root / "results.parquet").to_pandas()
    labels = {c.config.model.pe.kind: encoding_identity(c.config.model.pe)["pe_label"] for c in plan.to_run}
    assert dict(zip(results["pe_kind"], results["pe_label"], strict=True)) == labels
    md = build_report(plan.root).read_text()
    for label in labels.values():
        assert f"| {label} |" in md, label


@pytest.mark.parametrize("kind", ["rope", "fope", "rpe3d"])
def test_position_tables_are_cached_from_the_train_length_and_grow_with_longer_inputs(kind):
    enc = build_position_encoding(pe_config_class(kind)(kind=kind), SHAPE)
    assert enc.state_dict().keys().isdisjoint({"cos", "sin", "phases.cos", "phases.sin"})
    table = enc.phases  # every kind caches in one CosSinCache class
    assert table.cos.shape[0] == SHAPE.max_seq_len
    first = enc.tables(torch.arange(5), torch.float32)
    assert table.cos.shape[0] == SHAPE.max_seq_len  # no recomputation inside the train length
    longer = enc.tables(torch.arange(100), torch.float32)
    assert table.cos.shape[0] == 128
    torch.testing.assert_close(longer[0][..., :5, :], first[0])
    exact = enc.tables(torch.arange(100), torch.float64)  # float64 is computed afresh, the cache agrees
    torch.testing.assert_close(longer[0].double(), exact[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("overrides,expected", [
    (["model.pe.kind=fope", "model.max_seq_len=4"], "model.max_seq_len=4: FoPE keeps only frequencies that finish "
                                                     "a period within the train length"),
    (["model.pe.kind=fope", "model.dim=8", "model.n_heads=4", "model.n_kv_heads=1"],
     "head_dim=2: model.pe.kind='fope' needs head_dim >= 4"),
    (["model.pe.kind=fope", f"model.pe.seed={10**20}"],
     f"model.pe.seed={10**20}: must be an integer in [0, 2**63 - 1]"),
    (["model.pe.basis=random", "model.pe.seed=-1"], "model.pe.seed=-1: must be an integer in [0, 2**63 - 1]"),
    (["model.pe.kind=rpe3d", f"model.pe.chunk_size={10**20}"], f"model.pe.chunk_size={10**20}: must be a positive "
                                                                "integer <= 2147483647"),
    (["model.pe=null"], "model.pe=None: must be a mapping with a kind, e.g. model.pe.kind=rope"),
    (["model.max_seq_len=100000000"], "model.max_seq_len=100000000: the position tables of 100000000 positions × "
                                      "head_dim 32 take about 83.4 GiB to build, over the 4 GiB limit; use "
                                      "model.max_seq_len <= 4793490"),
    ([f"train.seed={10**20}"], f"train.seed={10**20}: must be an integer in [0, 2**32 - 1]"),
])
def test_what_an_encoding_cannot_be_built_with_is_a_user_error_before_building(overrides, expected):
    # each was a ZeroDivisionError, an OverflowError, an AttributeError or an 8+ GiB allocation
    import time

    start = time.perf_counter()
    with pytest.raises(UserError) as err:
        load_config("tiny", overrides)
    assert expected in str(err.value)
    assert time.perf_counter() - start < 5  # refused from the estimate, nothing allocated


def test_the_registry_checks_every_kind_before_it_builds():
    from trainer.model.position import encoding_problems

    assert encoding_problems(FoPEConfig(), SHAPE) == []
    assert encoding_problems(None, SHAPE)[0].startswith("model.pe=None")
    with pytest.raises(UserError, match=r"model\.pe\.chunk_size=0"):  # direct builds are checked too
        build_position_encoding(RPE3DConfig(chunk_size=0), SHAPE)
    assert not any(encoding_problems(cls(), EncodingShape(D, 4, 2, 2, 10**8)) for cls in (ALiBiConfig,))  # no tables
