"""Head importance: how much a score of the output (the log-probability of the chosen output, or
of one token against another) changes when one attention head is ablated (its output before
W_O zeroed, or set to its mean over the positions) or patched in from another input.

    score = Score(positions=[3], tokens=[es_id], vs=[sie_id])     # log p(es) - log p(sie) at 3
    found = head_effects(model, (src, tgt_in), score, ablate="patch", corrupt=(src2, tgt_in))
    found.effects["dec.cross"]                                     # (L, H) change of the score

Every head is measured in a few batched passes, not one run per head: the batch holds one
row per head, and each row's trace replaces a different head's ``head_out``
(:mod:`.trace`). Kinds of heads: ``enc.attn`` (encoder self-attention), ``dec.attn`` (decoder
self-attention; a language model's only kind) and ``dec.cross`` (cross-attention).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from .trace import Resume, trace

__all__ = ["Score", "HeadEffects", "head_effects", "head_kinds", "KIND_LABELS", "MODES"]

MODES = ("zero", "mean", "patch")
KIND_LABELS = {"enc.attn": "encoder self-attention", "dec.attn": "decoder self-attention",
               "dec.cross": "cross-attention"}


def head_kinds(model) -> tuple[str, ...]:
    """The kinds of heads ``model`` has (module docstring)."""
    return ("dec.attn",) if model.cfg.decoder_only else ("enc.attn", "dec.attn", "dec.cross")


def head_out_name(kind: str, layer: int) -> str:
    """("dec.cross", 2) -> "dec.2.cross.head_out"."""
    stack, sub = kind.split(".")
    return f"{stack}.{layer}.{sub}.head_out"


@dataclass(frozen=True)
class Score:
    """A number read off the logits at some positions of the output: the sum over i of
    log p(tokens[i]) at positions[i], minus log p(vs[i]) there when ``vs`` is given."""

    positions: Sequence[int]
    tokens: Sequence[int]
    vs: Sequence[int] | None = None

    def __call__(self, logits: Tensor) -> Tensor:
        """logits (B, N, V) at the N ``positions`` -> (B,) float32."""
        lp = logits.float().log_softmax(-1)
        index = torch.arange(len(self.positions), device=logits.device)
        out = lp[:, index, torch.as_tensor(list(self.tokens), device=logits.device)]
        if self.vs is not None:
            out = out - lp[:, index, torch.as_tensor(list(self.vs), device=logits.device)]
        return out.sum(-1)


@dataclass
class HeadEffects:
    """What :func:`head_effects` found."""

    mode: str  # "zero", "mean" or "patch"
    clean: float  # the score of the input as it is
    corrupt: float | None  # with "patch": the score of the corrupted input
    effects: dict[str, Tensor] = field(default_factory=dict)  # kind -> (L, H): score with the head changed - clean
    skipped: dict[str, str] = field(default_factory=dict)  # kind -> why it was not measured


def _per_kind(model, kind: str) -> int:
    return len(model.encoder.layers) if kind.startswith("enc") else len(model.decoder.layers)


@torch.no_grad()
def head_effects(model, inputs: Sequence[Tensor], score: Score, *, ablate: str = "zero",
                 corrupt: Sequence[Tensor] | None = None, kinds: Sequence[str] | None = None,
                 layers: Sequence[int] | None = None, rows: int = 48, real: Tensor | None = None) -> HeadEffects:
    """For every head of ``kinds`` (default: all of the model's), the change of ``score`` when
    that head's output is changed (``ablate``):

        "zero"   its output (before W_O) is 0 at every position
        "mean"   its output is its mean over the positions of this input
        "patch"  its output is the one it has on ``corrupt`` (inputs of the same shapes; a kind
                 whose positions differ, the encoder's when the corrupted source has another
                 length, is skipped and named in ``skipped``)

    ``inputs``: one sequence as :func:`~transformer.inspect.trace.trace` takes it (each tensor
    of one row); ``layers``: measure only these layers' heads (from 0; the others are NaN in
    ``effects``); ``real``: a language model's (1, T) real tokens (as its ``decode`` takes them;
    an imported GPT-2's padding id is a real token); ``rows``: at most this many heads per pass
    (the batch size). Each pass holds the heads of one layer of one stack and starts at that
    layer from the clean run's residual stream (:class:`~transformer.inspect.trace.Resume`): the
    layers before it are not run again.
    """
    if ablate not in MODES:
        raise ValueError(f"ablate={ablate!r}: choose one of {', '.join(MODES)}")
    if (ablate == "patch") != (corrupt is not None):
        raise ValueError("ablate='patch' needs corrupt inputs, and only it takes them")
    if any(x.size(0) != 1 for x in inputs):
        raise ValueError("head_effects reads one sequence: inputs of one row")
    kinds = head_kinds(model) if kinds is None else tuple(kinds)
    names = [head_out_name(k, i) for k in kinds for i in range(_per_kind(model, k))]
    at = list(score.positions)
    options = {} if real is None else {"real": real}
    starts = {f"{k.split('.')[0]}.{i}.resid_pre" for k in kinds for i in range(_per_kind(model, k))}
    keep = {*starts, *(["memory"] if not model.cfg.decoder_only else []), "logits"}
    clean_values = trace(model, *inputs, keep=keep if ablate == "zero" else {*keep, *names}, logits_at=at, **options)
    found = HeadEffects(ablate, float(score(clean_values["logits"])[0]), None)
    if ablate == "zero":
        sources = dict.fromkeys(names, torch.zeros((), dtype=clean_values["logits"].dtype))
    elif ablate == "mean":
        sources = {n: clean_values[n].mean(1, keepdim=True) for n in names}  # (1, 1, H, D)
    else:
        corrupt_values = trace(model, *corrupt, keep={*names, "logits"}, logits_at=at, **options)
        found.corrupt = float(score(corrupt_values["logits"])[0])
        sources = {n: corrupt_values[n] for n in names}
        for kind in kinds:
            first = head_out_name(kind, 0)
            if sources[first].shape != clean_values[first].shape:
                found.skipped[kind] = (f"the corrupted input has {sources[first].size(1)} positions here, "
                                       f"the input {clean_values[first].size(1)}")
    kinds = [k for k in kinds if k not in found.skipped]
    n_heads = model.cfg.n_heads
    units = [(k, i, h) for k in kinds for i in range(_per_kind(model, k)) for h in range(n_heads)]
    wanted = [u for u, (_, i, _) in enumerate(units) if layers is None or i in layers]
    # one pass per layer of a stack (its heads of every kind), started at that layer from the
    # clean run: a head changes nothing before its own layer
    groups: dict[tuple[str, int], list[int]] = {}
    for u in wanted:
        kind, layer, _ = units[u]
        groups.setdefault((kind.split(".")[0], layer), []).append(u)
    changes = torch.full((len(units),), float("nan"))
    for (stack, layer), members in groups.items():
        for start in range(0, len(members), rows):
            part = members[start:start + rows]
            resume = Resume(stack, layer, clean_values)
            changes[part] = _measure(model, inputs, score, [units[u] for u in part], sources, resume, real) \
                - found.clean
    done = 0
    for kind in kinds:
        n = _per_kind(model, kind) * n_heads
        found.effects[kind] = changes[done:done + n].view(-1, n_heads)
        done += n
    return found


def _measure(model, inputs, score: Score, chunk: list[tuple[str, int, int]], sources: dict[str, Tensor],
             resume: Resume, real: Tensor | None) -> Tensor:
    """The score of ``len(chunk)`` rows, row r with head ``chunk[r]``'s output replaced by its source."""
    n_rows, n_heads = len(chunk), model.cfg.n_heads
    chosen: dict[str, Tensor] = {}
    for r, (kind, layer, head) in enumerate(chunk):
        name = head_out_name(kind, layer)
        if name not in chosen:
            chosen[name] = torch.zeros(n_rows, n_heads, dtype=torch.bool)
        chosen[name][r, head] = True
    device = inputs[0].device
    replace = {name: _swap(m.to(device)[:, None, :, None], sources[name].to(device)) for name, m in chosen.items()}
    batch = [x.expand(n_rows, *x.shape[1:]).contiguous() for x in inputs]
    options = {} if real is None else {"real": real.expand(n_rows, -1)}
    values = trace(model, *batch, replace=replace, keep={"logits"}, logits_at=list(score.positions), resume=resume,
                   **options)
    return score(values["logits"]).cpu()


def _swap(where: Tensor, source: Tensor):
    """value -> the value with ``source`` where ``where`` (rows, 1, H, 1) is True."""
    return lambda value: torch.where(where, source.to(value.dtype), value)
