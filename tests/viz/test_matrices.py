"""The article's names of a language model's matrices (what ``transformer info`` lists): We and
Whead around the layers' WQ, WK, WV, WO, W_gate, W_up, W_down, each with its parameter."""
from __future__ import annotations

import torch

from transformer import ModelConfig
from transformer.model import LanguageModel
from transformer.viz.matrices import weight_matrices

SMALL = dict(vocab_size=23, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=40, dropout=0.0)


def make(preset: str, **extra) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(ModelConfig(**{**ModelConfig.preset(preset, vocab_size=23).to_dict(), **SMALL, **extra}))


def test_llama_lists_every_matrix_in_the_seeds_order():
    llama = make("llama-char")
    rows = weight_matrices(llama)
    names = [r[0] for r in rows]
    assert names[0] == "We" and names[-1] == "Whead"
    assert names[1:8] == [f"layer 1 {n}" for n in ("WQ", "WK", "WV", "WO", "W_gate", "W_up", "W_down")]
    assert len(names) == 2 + 7 * SMALL["n_layers"]
    params = dict(llama.named_parameters())
    for _, param, shape, count in rows:  # each row names the real parameter, its shape and size
        assert tuple(params[param].shape) == shape and params[param].numel() == count


def test_gpt_has_learned_positions_no_gate_and_a_tied_head_counted_once():
    gpt = make("nanogpt-char", bias=True)
    rows = {r[0]: r for r in weight_matrices(gpt)}
    assert "layer 1 W_gate" not in rows and "Wpos" in rows
    assert rows["Whead"][1:] == ("embed.weight (tied: We)", rows["We"][2], 0)
    # the matrices and the 1-D gains and biases are all the parameters there are
    vectors = sum(p.numel() for p in gpt.parameters() if p.dim() == 1)
    assert sum(r[3] for r in rows.values()) + vectors == gpt.num_parameters()
