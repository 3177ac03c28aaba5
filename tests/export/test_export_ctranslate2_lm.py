"""CTranslate2 export of the language model: ``ctranslate2.Generator`` gives the same greedy
continuations (token ids) and the same log-probabilities as our model, in float32, for
Llama-style (RMSNorm, rotary, SwiGLU, grouped-query attention) and GPT-style (LayerNorm,
learned positions, tanh-GELU, tied head) models.

CTranslate2 takes a batch of prompts of different lengths without padding: it forwards
the shortest prompt's length at once, then feeds the rest of each longer prompt in its
decoding loop; those prompt tokens appear in the result and count against ``max_length``.
So the batched comparison asks for ``max_length = N + (longest - shortest)`` and drops each
row's ``len(prompt) - shortest`` leading tokens; alone, a prompt needs no such correction.
Prompts never contain PAD, and PAD's output row is zeroed so that no model generates it
(our model would read a generated PAD as padding).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from transformer import ModelConfig  # noqa: E402
from transformer.decode import generate  # noqa: E402
from transformer.interop import save_ctranslate2_lm, to_ctranslate2_lm_spec  # noqa: E402
from transformer.model.lm import LanguageModel  # noqa: E402

V = 89
VOCAB = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, V)]
NEW = 12
PROMPTS = [[5, 17, 33, 8, 61, 12, 40], [9, 22], [71, 3, 3, 50, 18], [44], [13, 27, 80, 6, 30, 52, 7, 19, 64]]
SMALL = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_len=64, dropout=0.0)

MODELS = {
    "llama-gqa": ("llama-char", dict(d_ff=56, n_kv_heads=2)),
    "llama-tied-theta": ("llama-char", dict(d_ff=56, tie_embeddings=True, rope_theta=500.0)),
    "gpt2-tied": ("gpt2-small", dict(d_ff=128)),
    "gpt2-untied-eps": ("gpt2-small", dict(d_ff=128, tie_embeddings=False, layer_norm_eps=1e-6)),
    "nanogpt-no-bias": ("nanogpt-char", dict(d_ff=128)),
    # the paper's choices in a decoder-only model: post-norm, sinusoids, scaled embeddings, relu
    "paper-post-norm": ("gpt2-small", dict(d_ff=128, norm_first=False, final_norm=False, positions="sinusoidal",
                                           embed_scale=True, ffn_activation="relu")),
}


@torch.no_grad()
def random_model(preset: str, seed: int = 0, **overrides) -> LanguageModel:
    """Weights from our own generator: norm gains near 1, the rest N(0, 0.3); PAD's output
    row zero, so PAD is never the argmax."""
    model = LanguageModel(ModelConfig.preset(preset, **{**SMALL, **overrides})).eval()
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        p.copy_(1 + 0.2 * noise if "norm" in name and name.endswith("weight") else 0.3 * noise)
    model.output_layer()[0][model.cfg.pad_id].zero_()
    return model


def generator(path) -> "ctranslate2.Generator":
    return ctranslate2.Generator(str(path), device="cpu", compute_type="float32", intra_threads=1)


def ct2_greedy(gen, prompts, n=NEW):
    shortest, longest = min(map(len, prompts)), max(map(len, prompts))
    res = gen.generate_batch([[VOCAB[i] for i in p] for p in prompts], max_length=n + longest - shortest,
                             sampling_topk=1, include_prompt_in_result=False, return_end_token=True)
    rows = [[VOCAB.index(t) for t in r.sequences[0]] for r in res]
    return [row[len(p) - shortest:][:n] for row, p in zip(rows, prompts)]


def ours_greedy(model, prompts, n=NEW):
    return generate(model, prompts, n, temperature=0, stop_id=model.cfg.eos_id)


@pytest.mark.parametrize("variant", list(MODELS))
def test_generator_gives_our_greedy_continuations(variant, tmp_path):
    preset, overrides = MODELS[variant]
    model = random_model(preset, **overrides)
    gen = generator(save_ctranslate2_lm(model, tmp_path / "ct2", VOCAB))
    ours = ours_greedy(model, PROMPTS)
    print(variant, ours)
    assert len({tuple(r) for r in ours}) == len(PROMPTS), "the rows should differ"
    assert ct2_greedy(gen, PROMPTS) == ours  # batched
    for p, row in zip(PROMPTS, ours):  # each prompt alone
        assert ct2_greedy(gen, [p]) == [row]


@pytest.mark.parametrize("variant", ["llama-gqa", "gpt2-tied", "paper-post-norm"])
def test_generator_scores_are_our_log_probs(variant, tmp_path):
    preset, overrides = MODELS[variant]
    model = random_model(preset, **overrides)
    gen = generator(save_ctranslate2_lm(model, tmp_path / "ct2", VOCAB))
    seqs = [p + row for p, row in zip(PROMPTS, ours_greedy(model, PROMPTS))]
    scored = gen.score_batch([[VOCAB[i] for i in s] for s in seqs])
    worst = 0.0
    for s, r in zip(seqs, scored):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([s]))[0, :-1], dim=-1)
        ours = lp[torch.arange(len(s) - 1), torch.tensor(s[1:])].numpy()
        worst = max(worst, float(np.abs(np.array(r.log_probs) - ours).max()))
    print(f"{variant}: max |log-prob diff| {worst:.2e}")
    assert worst < 1e-4


def test_generator_stops_at_eos(tmp_path):
    """EOS's output row made 1.05 x that of a token the model often picks: rows stop early,
    with EOS, on both sides."""
    model = random_model("llama-char", d_ff=56, n_kv_heads=2)
    often = ours_greedy(model, PROMPTS)[1][1]
    with torch.no_grad():
        model.out_proj.weight[model.cfg.eos_id] = 1.05 * model.out_proj.weight[often]
    gen = generator(save_ctranslate2_lm(model, tmp_path / "ct2", VOCAB))
    ours = ours_greedy(model, PROMPTS)
    assert any(row[-1] == model.cfg.eos_id and len(row) < NEW for row in ours)
    assert [ct2_greedy(gen, [p])[0] for p in PROMPTS] == ct2_greedy(gen, PROMPTS) == ours


def test_spec_config_and_files(tmp_path):
    import json

    model = random_model("llama-char", d_ff=56)
    out = save_ctranslate2_lm(model, tmp_path / "ct2", VOCAB)
    assert {"model.bin", "config.json", "vocabulary.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert config["layer_norm_epsilon"] == pytest.approx(model.cfg.layer_norm_eps)
    assert json.loads((out / "vocabulary.json").read_text(encoding="utf-8")) == VOCAB
    with pytest.raises(ValueError, match="not empty"):
        save_ctranslate2_lm(model, out, VOCAB)


def test_what_ctranslate2_cannot_express_is_refused():
    with pytest.raises(ValueError, match="final norm"):
        to_ctranslate2_lm_spec(random_model("gpt2-small", d_ff=128, norm_first=False, final_norm=True), VOCAB)
    with pytest.raises(ValueError, match="vocabulary"):
        to_ctranslate2_lm_spec(random_model("gpt2-small", d_ff=128), VOCAB[:-1])
    with pytest.raises(ValueError, match="duplicate"):
        to_ctranslate2_lm_spec(random_model("gpt2-small", d_ff=128), VOCAB[:-1] + ["w4"])
