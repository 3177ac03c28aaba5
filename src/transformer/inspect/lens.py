"""The logit lens: what the model would predict if it stopped after each layer. The residual
stream of the output stack (the decoder's; the embeddings, then each layer's output) goes
through the stack's final norm (where the model has one) and the output projection, as the
last layer's does in the forward pass; so the last row is the model's own output.

    lens = logit_lens(model, src, tgt_in)   # or logit_lens(model, tokens)
    lens.log_probs                           # (L + 1, T, V): rows "embed", "1" .. "L"
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .trace import trace

__all__ = ["Lens", "lens_logits", "logit_lens", "stream_names"]


def stream_names(model) -> list[str]:
    """The output stack's residual stream, in order: the first layer's input, then every
    layer's output (``dec.0.resid_pre``, ``dec.0.resid_post`` .. ``dec.{L-1}.resid_post``)."""
    n = len(model.decoder.layers)
    return ["dec.0.resid_pre", *(f"dec.{i}.resid_post" for i in range(n))]


def lens_logits(model, values: dict[str, Tensor]) -> Tensor:
    """(L + 1, B, T, V) logits of each point of the residual stream of a trace's ``values``
    (which must hold :func:`stream_names`): final norm, then ``model.project``."""
    norm = model.decoder.norm
    rows = []
    for name in stream_names(model):
        h = values[name]
        rows.append(model.project(h if norm is None else norm(h)))
    return torch.stack(rows)


@dataclass(frozen=True)
class Lens:
    """One sequence's logit lens."""

    layers: list[str]  # row labels: "embed", "1" .. "L" (layers from 1, as the commands count)
    log_probs: Tensor  # (L + 1, T, V) float32, on the CPU
    chosen: Tensor  # (T,) the id the model finally predicts at each position (the last row's argmax)

    @property
    def chosen_prob(self) -> Tensor:
        """(L + 1, T): each layer's probability of the final choice."""
        return self.log_probs.gather(2, self.chosen[None, :, None].expand(len(self.layers), -1, 1))[..., 0].exp()

    def top(self, k: int = 1) -> tuple[Tensor, Tensor]:
        """(L + 1, T, k) probabilities and ids of each layer's ``k`` most probable tokens."""
        p, i = self.log_probs.topk(min(k, self.log_probs.size(-1)), dim=-1)
        return p.exp(), i


@torch.no_grad()
def logit_lens(model, *inputs: Tensor, **options) -> Lens:
    """The lens of one sequence: ``inputs`` as :func:`~transformer.inspect.trace.trace` takes
    them, each with one row (translation: src (1, S), tgt_in (1, T); language model: (1, T));
    ``options``: the trace's others (a language model's ``real``, ``replace``)."""
    if inputs[0].size(0) != 1:
        raise ValueError("logit_lens reads one sequence: inputs of one row")
    values = trace(model, *inputs, keep=stream_names(model), logits_at=[], **options)  # the lens projects itself
    logits = lens_logits(model, values)[:, 0].float()  # (L + 1, T, V)
    log_probs = logits.log_softmax(-1).cpu()
    layers = ["embed", *(str(i + 1) for i in range(logits.size(0) - 1))]
    return Lens(layers, log_probs, log_probs[-1].argmax(-1))
