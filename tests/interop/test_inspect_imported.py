"""The trace, the logit lens and the head map on imported models: GPT-2, Llama and Qwen2 runs
imported from tiny random Hugging Face checkpoints (built in the test, as ``transformer import``
reads them), and a Marian model converted in memory. The lens of each layer is HF's own
``output_hidden_states`` through HF's final norm and head."""
from __future__ import annotations

import os

import pytest
import torch

from hf_checkpoints import PROMPT, build_checkpoint
from transformer.cli import main
from transformer.inspect import Score, head_effects, logit_lens, trace
from transformer.run import load_model

pytest.importorskip("transformers")
os.environ.setdefault("OMP_NUM_THREADS", "1")

FAMILIES = ["gpt2", "llama3", "qwen2"]


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request, tmp_path_factory):
    """(family, HF model, our model loaded from the imported run, prompt ids)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp(request.param)
    folder, hf = build_checkpoint(request.param, root / "hf")
    assert main(["import", str(folder), "--out", str(root / "run")]) == 0
    model, _ = load_model(root / "run")
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT)["input_ids"]
    return request.param, hf, model, torch.tensor([ids])


def hf_final(family: str, hf):
    """HF's final norm."""
    return hf.transformer.ln_f if family == "gpt2" else hf.model.norm


@torch.no_grad()
def test_lens_is_hf_hidden_states_through_hf_norm_and_head(imported):
    family, hf, model, ids = imported
    out = hf(ids, output_hidden_states=True)
    states = out.hidden_states  # embeddings, then each layer's output; the last one already normed
    expected = [hf.lm_head(hf_final(family, hf)(h)) for h in states[:-1]] + [out.logits]
    expected = torch.stack([e[0].log_softmax(-1) for e in expected])
    lens = logit_lens(model, ids)
    assert lens.log_probs.shape == expected.shape
    assert (lens.log_probs - expected).abs().max() < 1e-5


@torch.no_grad()
def test_trace_and_heads_on_an_imported_model(imported):
    _, _, model, ids = imported
    assert torch.equal(trace(model, ids)["logits"], model(ids))
    chosen = int(model(ids)[0, -1].argmax())
    found = head_effects(model, (ids,), Score([ids.size(1) - 1], [chosen]))
    assert found.effects["dec.attn"].shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert torch.isfinite(found.effects["dec.attn"]).all()


@torch.no_grad()
def test_marian_trace_and_lens_are_hf_marian():
    from hf_checkpoints import randomize_marian
    from transformers import MarianConfig, MarianMTModel

    from transformer.interop import from_marian

    config = MarianConfig(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          activation_function="relu", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          max_position_embeddings=64, scale_embedding=True, pad_token_id=59,
                          decoder_start_token_id=59, eos_token_id=0, forced_eos_token_id=0)
    hf = MarianMTModel(config).eval()
    randomize_marian(hf)
    model = from_marian(hf)
    src, tgt = torch.tensor([[5, 17, 33, 8, 0]]), torch.tensor([[59, 12, 40, 9]])
    assert torch.equal(trace(model, src, tgt)["logits"], model(src, tgt))
    out = hf(input_ids=src, decoder_input_ids=tgt, output_hidden_states=True)
    expected = torch.stack([(hf.lm_head(h) + hf.final_logits_bias)[0].log_softmax(-1)
                            for h in out.decoder_hidden_states])  # post-norm: no final norm
    assert (logit_lens(model, src, tgt).log_probs - expected).abs().max() < 1e-5


@torch.no_grad()
def test_a_padding_id_inside_a_prompt_is_read_as_a_token_when_asked(imported):
    """An imported GPT-2's padding id is a real token's: with ``real`` all True the lens and the
    head map read it as HF does (the commands pass it so)."""
    family, hf, model, ids = imported
    ids = torch.cat([ids[:, :3], torch.tensor([[model.cfg.pad_id]]), ids[:, 3:]], 1)
    real = torch.ones_like(ids, dtype=torch.bool)
    out = hf(ids, output_hidden_states=True)
    assert (logit_lens(model, ids, real=real).log_probs[-1] - out.logits[0].log_softmax(-1)).abs().max() < 1e-5
    chosen = int(out.logits[0, -1].argmax())
    found = head_effects(model, (ids,), Score([ids.size(1) - 1], [chosen]), real=real)
    assert found.clean == pytest.approx(float(out.logits[0, -1].log_softmax(-1)[chosen]), abs=1e-5)
