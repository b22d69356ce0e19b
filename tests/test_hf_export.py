"""Exact export to Hugging Face: the exported LlamaForCausalLM gives the lab model's logits (fp32, 1e-4), with and
without a KV cache, for every rotation dim, fixed basis and static scaling; RoPE's cost at inference (NOTES §2)."""

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from trainer.export.hf_export import export_model, hf_rotary_map
from trainer.model.generate import greedy_generate
from trainer.model.llama import KVCache, Llama
from trainer.presets import load_config

SCALINGS = {
    "none": None,
    "linear": "{rope_type: linear, factor: 2.0}",
    "yarn": "{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32}",
    "llama3": "{rope_type: llama3, factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
              "original_max_position_embeddings: 32}",
}


def _lab_and_hf(tmp_path, *overrides):
    from transformers import LlamaForCausalLM

    cfg = load_config("tiny", list(overrides))
    torch.manual_seed(3)
    model = Llama(cfg.model).eval()
    with torch.no_grad():  # a trained-looking model: norms and every weight off their init values
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf = LlamaForCausalLM.from_pretrained(export_model(cfg, model, tmp_path / "hf"), attn_implementation="eager")
    return cfg, model, hf.eval()


@pytest.mark.parametrize("n,basis", [(2, "identity"), (2, "paley"), (2, "random"), (4, "paley"), (4, "identity"),
                                     (4, "random"), (8, "paley"), (8, "hadamard"), (32, "random"), (32, "dct")])
@pytest.mark.parametrize("scaling", sorted(SCALINGS))
def test_exported_hf_llama_gives_the_same_logits(tmp_path, n, basis, scaling):
    overrides = [f"model.pe.rotation_dim={n}", f"model.pe.basis={basis}", "model.pe.seed=7"]
    if SCALINGS[scaling]:
        overrides.append(f"model.pe.scaling={SCALINGS[scaling]}")
    cfg, ours, hf = _lab_and_hf(tmp_path, *overrides)
    x = torch.randint(0, cfg.model.vocab_size, (2, 96))  # past the train length (64)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), atol=1e-4, rtol=0)
        # with a KV cache: a prefix, then one token at a time
        cache, past = KVCache(cfg.model.n_layers), None
        a = ours(x[:, :40], cache=cache)
        out = hf(x[:, :40], use_cache=True)
        torch.testing.assert_close(out.logits, a, atol=1e-4, rtol=0)
        past = out.past_key_values
        for t in range(40, 48):
            a = ours(x[:, t:t + 1], cache=cache)
            out = hf(x[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            torch.testing.assert_close(out.logits, a, atol=1e-4, rtol=0)


@pytest.mark.parametrize("n,per_head", [(2, False), (2, True), (4, True)])
def test_a_trained_looking_string_model_exports_as_plain_hf_rope_with_the_same_logits(tmp_path, n, per_head):
    """Cayley-STRING is R in a learned basis P per layer (and KV head): P folds into W_q/W_k like HD-RoPE's Q."""
    cfg, ours, hf = _lab_and_hf(tmp_path, "model.pe.kind=string", f"model.pe.rotation_dim={n}",
                                f"model.pe.per_head={str(per_head).lower()}")
    assert ours.pe.a.abs().min() > 0  # the noise moved every basis off the identity
    assert hf.config.rope_parameters["rope_type"] == ("default" if n == 2 else "longrope")
    x = torch.randint(0, cfg.model.vocab_size, (2, 96))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), atol=1e-4, rtol=0)


def test_rope_exports_as_default_rope_and_hd_rope_as_per_frequency_factors():
    _, rope = hf_rotary_map(load_config("tiny", ["model.pe.kind=rope"]).model)
    assert rope["rope_type"] == "default"
    _, hd = hf_rotary_map(load_config("tiny", ["model.pe.rotation_dim=4"]).model)
    assert hd["rope_type"] == "longrope" and len(hd["short_factor"]) == 16
    assert len(set(round(f, 9) for f in hd["short_factor"])) < 16  # two pairs share each block frequency


def test_what_cannot_be_exported_says_so(tmp_path, cache_dir):
    from hdrope.errors import UserError

    with pytest.raises(UserError, match="not exportable to HF Llama"):
        hf_rotary_map(load_config("tiny", ["model.pe.kind=nope"]).model)
    with pytest.raises(UserError, match="not exportable to HF Llama: its frequencies are learned per layer and head"):
        hf_rotary_map(load_config("tiny", ["model.pe.kind=rope_mixed"]).model)
    with pytest.raises(UserError, match="depends on the sequence length"):
        hf_rotary_map(load_config("tiny", ["model.pe.scaling={rope_type: dynamic, factor: 2.0}"]).model)


def test_hdrope_export_cli_on_a_trained_checkpoint(tmp_path, cache_dir):
    from transformers import LlamaForCausalLM

    from trainer.run.loop import train
    from trainer.run.trained import load_trained

    cfg = load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / 'run'}", "train.steps=20",
                               "eval.passkey.enabled=false", "model.pe.rotation_dim=8"])
    ckpt = train(cfg).checkpoint
    out = _export_without_transformers(ckpt, tmp_path / "hf")
    assert out.returncode == 0, out.stderr[-2000:]
    # the run's byte tokenizer's ids (config.json used to say bos 1 / eos 2, so generate stopped on byte 0x02)
    for name in ("config.json", "generation_config.json"):
        written = json.loads((tmp_path / "hf" / name).read_text())
        assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (256, 257, 258), name
    meta = json.loads((tmp_path / "hf" / "hdrope_export.json").read_text())
    trained = load_trained(ckpt)
    assert meta["config_hash"] == trained.config_hash
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    prompt = trained.tok.encode("ROMEO. ")
    ours = greedy_generate(trained.model, prompt, 12)
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    assert theirs == ours
    again = subprocess.run([sys.executable, "-m", "sweeps.console", "export", str(ckpt), str(tmp_path / "hf")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "not empty" in again.stderr


def _export_without_transformers(ckpt, out_dir, cwd=None) -> subprocess.CompletedProcess:
    """`hdrope export CKPT OUT_DIR` in an interpreter where `import transformers` fails (the README's install)."""
    code = "import sys; sys.modules['transformers'] = None; from sweeps.console import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, "export", str(ckpt), str(out_dir)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_export_from_another_directory_ships_the_runs_own_tokenizer_and_its_ids(tmp_path, cache_dir, monkeypatch):
    # a relative data.tokenizer used to resolve against the exporting command's directory: another file shipped
    from transformers import LlamaForCausalLM

    from trainer.data.tokenizer import JsonTokenizer, train_bpe
    from trainer.run.loop import train
    from trainer.run.trained import load_trained

    corpus = tmp_path / "small.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 200)
    for where, text in (("here", corpus.read_text()), ("elsewhere", "Now is the winter of our discontent. " * 200)):
        (tmp_path / where).mkdir()
        train_bpe([text], 300, tmp_path / where / "tok.json")
    monkeypatch.chdir(tmp_path / "here")
    cfg = load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / 'run'}", "data.corpus=files",
                               f"data.paths=[{corpus}]", "data.tokenizer=tok.json", "model.vocab_size=300",
                               "train.steps=4", "eval.passkey.enabled=false", "eval.extrapolation_batches=0"])
    ckpt = train(cfg).checkpoint
    out = _export_without_transformers(ckpt, tmp_path / "hf", cwd=tmp_path / "elsewhere")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (tmp_path / "here" / "tok.json").read_bytes()
    tok = JsonTokenizer(tmp_path / "here" / "tok.json")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (None, tok.eos_id, tok.pad_id)
    assert tok.eos_id is not None and tok.pad_id is not None
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    model = load_trained(ckpt).model
    x = torch.tensor([tok.encode("To be, or not to be")])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), atol=1e-4, rtol=0)


def test_hdrope_export_of_a_trained_string_checkpoint_gives_its_logits(tmp_path, cache_dir):
    from transformers import LlamaForCausalLM

    from trainer.export.hf_export import export_checkpoint
    from trainer.run.loop import train
    from trainer.run.trained import load_trained

    cfg = load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / 'run'}", "train.steps=6",
                               "eval.passkey.enabled=false", "eval.extrapolation_batches=0", "model.pe.kind=string",
                               "model.pe.per_head=true"])
    ckpt = train(cfg).checkpoint
    model = load_trained(ckpt).model
    assert model.pe.a.abs().max() > 0  # the basis was trained away from the identity
    hf = LlamaForCausalLM.from_pretrained(export_checkpoint(ckpt, tmp_path / "hf")).eval()
    x = torch.randint(0, cfg.model.vocab_size, (2, 80))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), atol=1e-4, rtol=0)


NOPE_EVERY_4TH = "model.pe_layers=[{layers: 'every 4th', pe: {kind: nope}}]"
STACKS = {  # issue 46: the hybrid stacks transformers 5 holds, as SmolLM3's no_rope_layers and layer_types
    "4D Paley + NoPE every 4th": ["model.n_layers=8", NOPE_EVERY_4TH],
    "RNoPE-SWA: RoPE local, NoPE global": ["model.n_layers=4", "model.pe.kind=rope", NOPE_EVERY_4TH,
                                           "model.window=16", "model.layer_pattern='3 local, 1 global'"],
    "NoPE on every layer": ["model.pe.kind=nope"],
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_hybrid_stack_exports_as_smollm3_with_the_same_logits_and_greedy_decoding(tmp_path, stack):
    from transformers import AutoModelForCausalLM

    cfg = load_config("tiny", STACKS[stack])
    torch.manual_seed(3)
    ours = Llama(cfg.model).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = export_model(cfg, ours, tmp_path / "hf")
    written = json.loads((out / "config.json").read_text())
    n, every = cfg.model.n_layers, 1 if stack == "NoPE on every layer" else 4
    assert written["model_type"] == "smollm3"
    assert written["no_rope_layers"] == [int((i + 1) % every != 0) for i in range(n)]
    assert written["layer_types"] == ["sliding_attention" if w else "full_attention" for w in cfg.model.layer_windows]
    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(hf).__name__ == "SmolLM3ForCausalLM"
    x = torch.randint(0, cfg.model.vocab_size, (2, 96))  # past the train length (64) and the window
    with torch.no_grad():
        diff = (hf(x).logits - ours(x)).abs().max().item()
    assert diff < 1e-5, diff
    prompt = x[0, :20].tolist()
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):].tolist()
    assert theirs == greedy_generate(ours, prompt, 30)


@pytest.mark.parametrize("layers,reason", [
    ("[{layers: [1], pe: {kind: rope}}]", r"model.pe_layers: layers 1 \(rope\) and layers 0, 2, 3 \(hdrope\) need two "
                                          "different rotaries"),
    ("[{layers: [2], pe: {kind: alibi}}]", r"model.pe_layers: layers 2 \(alibi\): model.pe.kind='alibi' is not "
                                           "exportable"),
])
def test_a_stack_hf_cannot_hold_is_refused_naming_the_layer(tmp_path, layers, reason):
    from hdrope.errors import UserError

    cfg = load_config("tiny", ["model.n_layers=4", f"model.pe_layers={layers}"])
    with pytest.raises(UserError, match=reason):
        export_model(cfg, Llama(cfg.model), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
