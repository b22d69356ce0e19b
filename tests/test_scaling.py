import math

import numpy as np
import pytest
import torch

from hdrope import HDRotary, validate_scaling
from hdrope.errors import UserError


def test_linear_scaling_is_position_interpolation():
    plain = HDRotary(64, 4, 1e4)
    scaled = HDRotary(64, 4, 1e4, scaling={"rope_type": "linear", "factor": 4.0})
    np.testing.assert_allclose(scaled.rotation_matrix(400), plain.rotation_matrix(100), atol=1e-12)


def test_llama3_keeps_high_and_divides_low_frequencies():
    cfg = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    rot = HDRotary(64, 4, 5e5, scaling=cfg)
    base, got = rot.frequencies, rot.scaled_frequencies().freqs
    wavelen = 2 * math.pi / base
    np.testing.assert_allclose(got[wavelen < 256 / 4], base[wavelen < 256 / 4])
    np.testing.assert_allclose(got[wavelen > 256], base[wavelen > 256] / 8)
    mid = (wavelen >= 64) & (wavelen <= 256)
    assert np.all(got[mid] <= base[mid]) and np.all(got[mid] >= base[mid] / 8)


def test_yarn_ramp_and_attention_factor():
    cfg = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    rot = HDRotary(64, 2, 1e4, scaling=cfg)
    sf = rot.scaled_frequencies()
    assert sf.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert sf.freqs[0] == rot.frequencies[0]  # fastest frequency extrapolates
    assert sf.freqs[-1] == pytest.approx(rot.frequencies[-1] / 4)  # slowest interpolates
    # attention factor scales the whole rotation, as in HF
    r = rot.rotation_matrix(3)
    np.testing.assert_allclose(r.T @ r, sf.attention_factor**2 * np.eye(64), atol=1e-12)


def test_dynamic_ntk_changes_only_past_original_length():
    cfg = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
    rot = HDRotary(32, 4, 1e4, scaling=cfg)
    plain = HDRotary(32, 4, 1e4)
    x = torch.randn(1, 1, 64, 32)
    a, _ = rot(x, x, torch.arange(64))
    b, _ = plain(x, x, torch.arange(64))
    torch.testing.assert_close(a, b)
    longer = rot.scaled_frequencies(seq_len=256).freqs
    assert longer[0] == 1.0 and np.all(longer[1:] < plain.frequencies[1:])


def test_longrope_switches_factor_lists():
    f = 64 // 4
    cfg = {
        "rope_type": "longrope",
        "short_factor": [1.0] * f,
        "long_factor": [2.0] * f,
        "original_max_position_embeddings": 128,
        "factor": 4.0,
    }
    rot = HDRotary(64, 4, 1e4, scaling=cfg)
    np.testing.assert_allclose(rot.scaled_frequencies(100).freqs, rot.frequencies)
    np.testing.assert_allclose(rot.scaled_frequencies(500).freqs, rot.frequencies / 2)
    assert rot.scaled_frequencies(500).attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(128)))


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"rope_type": "warp", "factor": 2}, "unknown"),
        ({"rope_type": "linear"}, "missing required key"),
        ({"rope_type": "linear", "factor": 2, "beta": 1}, r"unknown key\(s\) \['beta'\]"),
        ({"rope_type": "linear", "factor": 0.5}, "factor=0.5"),
        ({"rope_type": "linear", "factor": "2"}, "factor must be a number"),
        ({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": -1}, "positive integer"),
        (
            {
                "rope_type": "llama3",
                "factor": 8,
                "low_freq_factor": 4,
                "high_freq_factor": 1,
                "original_max_position_embeddings": 8,
            },
            "high_freq_factor",
        ),
        ({"factor": 2}, "no rope_type"),
        ([1, 2], "mapping"),
    ],
)
def test_bad_scaling_names_the_key(cfg, match):
    with pytest.raises(UserError, match=match):
        validate_scaling(cfg)


def test_longrope_list_length_is_checked_at_construction():
    cfg = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 32,
        "long_factor": [1.0] * 32,
        "original_max_position_embeddings": 128,
    }
    with pytest.raises(UserError, match="one factor per block frequency"):
        HDRotary(64, 4, 1e4, scaling=cfg)


def test_hf_legacy_type_key_is_accepted():
    assert validate_scaling({"type": "linear", "factor": 2.0})["rope_type"] == "linear"


# ---- parity with HF transformers' own rope initialisers (ROPE_INIT_FUNCTIONS, transformers 5) ----------------
HF_CASES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},  # HF takes the original length from the model config
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn-null-betas": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                        "beta_fast": None, "beta_slow": None},
    "yarn-untruncated": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                         "truncate": False},
    "longrope-phi3": {"rope_type": "longrope", "original_max_position_embeddings": 512,  # no factor: Phi-3
                      "short_factor": [1.0 + i / 64 for i in range(32)],
                      "long_factor": [2.0 + i / 32 for i in range(32)]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    # HF's standardize_rope_params fills llama3's original length from max_position_embeddings
    "llama3-no-original": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
@pytest.mark.parametrize("seq_len", [None, 4096])
def test_rope_parameters_from_a_llama_config_match_hf(name, seq_len):
    """A `rope_parameters` dict straight from a Llama config (rope_theta included) is accepted as it is, and N = 2
    gives HF's inverse frequencies and attention factor, with HF's defaults for the keys it fills itself."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta, max_pos = 5e5, 2048
    params = {"rope_theta": theta, **HF_CASES[name]}
    hf_cfg = LlamaConfig(hidden_size=1024, num_attention_heads=16, max_position_embeddings=max_pos,
                         rope_parameters=dict(params))
    inv_freq, hf_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg, "cpu", seq_len=seq_len)
    rot = HDRotary(64, 2, theta, basis="identity", scaling=dict(params), max_position=max_pos)
    ours = rot.scaled_frequencies(seq_len)
    np.testing.assert_allclose(ours.freqs, inv_freq.double().numpy(), rtol=2e-6)
    assert ours.attention_factor == pytest.approx(float(hf_factor), rel=1e-6)


def test_phi3_longrope_derives_its_factor_and_attention_factor_like_hf():
    params = {"rope_type": "longrope", "original_max_position_embeddings": 4096,
              "short_factor": [1.0] * 16, "long_factor": [1.5] * 16}
    rot = HDRotary(64, 4, 1e4, scaling=params, max_position=131072)
    assert rot.scaled_frequencies().attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert rot.scaled_frequencies().attention_factor == pytest.approx(1.1902, abs=1e-4)


@pytest.mark.parametrize("cfg,match", [
    ({"rope_type": "linear", "factor": 2, "rope_theta": 5e5, "typo_key": 1}, r"unknown key\(s\) \['typo_key'\]"),
    ({"rope_type": "linear", "factor": 2, "rope_theta": 123.0}, "rope_theta=123.0 disagrees with theta=500000.0"),
    ({"rope_type": "linear", "factor": 2, "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 64, "truncate": "no"}, "truncate"),
    ({"rope_type": "default", "factor": 2}, r"key\(s\) \['factor'\] with rope_type=default"),
])
def test_rope_parameters_errors_name_the_key(cfg, match):
    with pytest.raises(UserError, match=match):
        validate_scaling(cfg, max_position=2048, theta=5e5)


def test_a_plain_rope_parameters_dict_means_no_scaling():
    assert validate_scaling({"rope_type": "default", "rope_theta": 5e5}, theta=5e5) is None
