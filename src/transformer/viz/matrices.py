"""A model's weight matrices under the article's names: the embedding ``We``, the
output head ``Whead`` and, per layer, ``WQ, WK, WV, WO, W_gate, W_up, W_down`` (what
``transformer info`` prints and ``transformer explain --training`` follows)."""
from __future__ import annotations

from ..model.embedding import LearnedPositions
from ..model.lm import LanguageModel


def weight_matrices(model: LanguageModel) -> list[tuple[str, str, tuple[int, ...], int]]:
    """The model's matrices in the article's names: (article's name, parameter name, shape, count),
    We and Whead first, then per layer WQ, WK, WV, WO, W_gate, W_up, W_down."""
    rows = [("We", "embed.weight", tuple(model.embed.weight.shape), model.embed.weight.numel())]
    if model.positions is not None and isinstance(model.positions, LearnedPositions):
        w = model.positions.weight
        rows.append(("Wpos", "positions.weight", tuple(w.shape), w.numel()))
    for i, layer in enumerate(model.decoder.layers):
        a, f = layer.self_attn, layer.ffn
        named = [("WQ", a.q_proj), ("WK", a.k_proj), ("WV", a.v_proj), ("WO", a.out_proj),
                 ("W_gate", f.gate), ("W_up", f.fc1), ("W_down", f.fc2)]
        for seed_name, lin in named:
            if lin is None:
                continue
            param = next(n for n, p in model.named_parameters() if p is lin.weight)
            rows.append((f"layer {i + 1} {seed_name}", param, tuple(lin.weight.shape), lin.weight.numel()))
    head = model.embed.weight if model.out_proj is None else model.out_proj.weight
    rows.append(("Whead", "embed.weight (tied: We)" if model.out_proj is None else "out_proj.weight",
                 tuple(head.shape), 0 if model.out_proj is None else head.numel()))
    return rows
