"""A prompt through a decoder-only language model, step by step, in the seed's terms: the
embedding We, positions (learned, sinusoidal, or the rotation of q and k), masked
self-attention (Q, K, V, scores, causal mask, softmax, WO), Add & Norm, the FFN (gated:
W_gate, W_up, W_down), the final norm, Whead, softmax and the next token.

Every step calls the model's own sub-modules (``embed``, ``positions`` / ``rotary``,
``project_qkv``, ``out_proj``, the norms, ``fc1`` / ``gate`` / ``fc2``, ``project``) and repeats
only the glue between them, in the order of :meth:`LanguageModel.hidden` and
:class:`~transformer.model.layers.DecoderLayer`, so the recomputed logits equal
``model.decode(..., return_weights=True)`` (the explicit-attention path) bit for bit; the
result records that check and the tests assert it.

Shape legend: T prompt tokens, H heads, d_k = d_model / H, V vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import masks
from ..model.embedding import LearnedPositions
from ..model.rotary import apply_rotary
from . import lm_steps as rec
from .steps import positions_step
from .walkthrough import format_steps, step_dicts, sublayer

STEPS = ["1", "2", "3a", "3b", "3c", "4", "5", "6", "7", "8", "9"]


SPECIAL = {0: "<pad>", 1: "<s>", 2: "</s>"}


def token_shower(tokenizer) -> Callable[[int], str]:
    """id -> a printable token of a language model's ``tokenizer``: a character (a space as
    "▁", a newline as "\\n"), or a subword piece (the newline token EOS as "\\n")."""
    subwords = getattr(tokenizer, "subwords", None)
    if subwords is not None:  # LineSubwords: EOS stands for a newline
        return lambda i: "\\n" if i == tokenizer.eos_id else subwords.id_to_piece(int(i))

    def show(i: int) -> str:
        c = tokenizer.decode([int(i)])
        return {"": SPECIAL.get(int(i), "?"), " ": "▁", "\n": "\\n", "\t": "\\t"}.get(c, c)

    return show


@dataclass
class CausalAttention:
    """One layer's masked self-attention, opened up (batch of one prompt)."""

    q: Tensor  # (1, H, T, D) the queries (rotated, with RoPE)
    k: Tensor  # (1, H, T, D) the keys (rotated; repeated for each query head under grouped-query attention)
    v: Tensor  # (1, H, T, D)
    raw_scores: Tensor  # (1, H, T, T) Q K^T, before the scaling and the mask
    weights: Tensor  # (1, H, T, T) softmax(Q K^T / sqrt(d_k) + M)
    concat: Tensor  # (1, T, H * d_k) the heads side by side
    out: Tensor  # (1, T, d_model) concat WO


@dataclass
class LMWalkthrough:
    pieces: list[str]
    steps: list
    logits: Tensor  # (1, T, V) recomputed logits
    checks: dict[str, float | bool]


def open_causal_attention(mha, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> CausalAttention:
    """MultiHeadAttention.attend and attention() (explicit path) on projected (and, with
    RoPE, rotated) q (1, H, T, D), k, v (1, H_kv, T, D)."""
    if mha.n_kv_heads != mha.n_heads:  # grouped-query attention: each K/V head serves several query heads
        k = k.repeat_interleave(mha.n_heads // mha.n_kv_heads, dim=1)
        v = v.repeat_interleave(mha.n_heads // mha.n_kv_heads, dim=1)
    raw = q @ k.transpose(-2, -1)  # (1, H, T, T)
    scores = raw / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    heads = weights @ v  # (1, H, T, D)
    b, _, t, _ = heads.shape
    concat = heads.transpose(1, 2).reshape(b, t, mha.n_heads * mha.d_head)
    return CausalAttention(q, k, v, raw, weights, concat, mha.out_proj(concat))


def ffn_parts(ffn, x: Tensor) -> dict[str, Tensor]:
    """FeedForward.forward, keeping x W_up, x W_gate (gated only), the hidden layer and the output."""
    if ffn.gate is not None:
        up, gate = ffn.fc1(x), ffn.gate(x)
        hidden = up * F.silu(gate)  # FeedForward.hidden's order of operations
        return {"up": up, "gate": gate, "hidden": hidden, "out": ffn.fc2(hidden)}
    hidden = ffn.hidden(x)
    return {"hidden": hidden, "out": ffn.fc2(hidden)}


@torch.inference_mode()
def walk_lm(model, ids: list[int], show: Callable[[int], str], decoding) -> LMWalkthrough:
    """Run the prompt ``ids`` through ``model`` (a LanguageModel in eval mode) step by step.

    Args:
        ids: the prompt's token ids (1 .. max_len of them), as the tokenizer encodes it.
        show: id -> a printable token ("▁" for a space, "\\n" for a newline).
        decoding: a DecodingConfig: its temperature, top_k and top_p for step 9.
    """
    cfg = model.cfg
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)  # (1, T)
    T = tokens.size(1)
    pieces = [show(i) for i in ids]
    t_dims = ("T", T, "tokens")
    positions = torch.arange(T, device=device)[None]  # (1, T): LanguageModel.hidden's positions for one prompt

    # (1), (2): LanguageModel.hidden before the layers (dropout is off in eval mode)
    looked_up = F.embedding(tokens, model.embed.weight)  # (1, T, C)
    x = looked_up * model.embed.scale
    steps = [rec.embedding_step(cfg, model.embed.scale, looked_up, x, pieces, ids, t_dims)]
    if isinstance(model.positions, LearnedPositions):
        wpos = F.embedding(positions, model.positions.weight)  # (1, T, C)
        steps.append(rec.learned_positions_step(cfg, wpos[0], x, t_dims))
        x = x + wpos.to(x.dtype)
    elif model.positions is not None:  # the paper's sinusoids
        pe = model.positions.pe[positions]  # (1, T, C)
        steps.append(positions_step(cfg, pe[0], t_dims))
        x = x + pe.to(x.dtype)
    rotary = model.rotary(positions) if model.rotary is not None else None

    x, layer_steps, rotated = _layers(model, x, rotary, pieces, t_dims)
    if rotary is not None:
        steps.append(rec.rotary_step(cfg, model.rotary, *rotated, t_dims))
    steps += layer_steps

    logits = model.project(x)  # (1, T, V)
    steps += [rec.head_step(cfg, model, logits, t_dims), rec.softmax_step(logits, ids, show, t_dims, cfg.vocab_size),
              rec.choice_step(logits, show, decoding)]

    ref, _, _ = model.decode(tokens, model.start_cache(1, device), return_weights=True)  # explicit attention
    fused = model(tokens)  # what generation runs: torch's fused attention where it is faster
    checks = {"logits_max_abs_diff": float((logits - ref).abs().max()), "bit_identical": bool(torch.equal(logits, ref)),
              "fused_max_abs_diff": float((logits - fused).abs().max())}
    return LMWalkthrough(pieces, steps, logits, checks)


def _layers(model, x: Tensor, rotary, pieces: list[str], t_dims):
    """Decoder.forward: every layer; steps (3a)-(5) recorded for layer 1, a line for each of
    the others, (6) for the stack and the final norm. Returns the final hidden states
    (1, T, C), the steps and layer 1's (q, k, q rotated, k rotated)."""
    cfg = model.cfg
    T = x.size(1)
    mask = None if T == 1 else masks.causal_mask(T, T, x.device)  # (1, 1, T, T), as Decoder.forward
    steps, later, rotated = [], [], None
    for n, layer in enumerate(model.decoder.layers):
        parts = {}

        def masked_self_attention(h, layer=layer, parts=parts):
            q, k, v = layer.self_attn.project_qkv(h)  # (1, H, T, D), (1, H_kv, T, D)
            parts["qk"] = (q, k)
            if rotary is not None:
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
                parts["qk"] += (q, k)
            parts["attn"] = open_causal_attention(layer.self_attn, q, k, v, mask)
            return parts["attn"].out

        def feed_forward(h, layer=layer, parts=parts):
            parts["ffn"] = ffn_parts(layer.ffn, h)
            return parts["ffn"]["out"]

        x_in = x
        x, s_attn, y = sublayer(layer.self_block, x, masked_self_attention)
        x, _, _ = sublayer(layer.ffn_block, x, feed_forward)
        a: CausalAttention = parts["attn"]
        if n == 0:
            rotated = parts["qk"] if rotary is not None else None
            steps += [rec.scores_step(cfg, a, pieces, t_dims), rec.mask_softmax_step(cfg, a, pieces, t_dims),
                      rec.concat_step(cfg, a, t_dims), rec.add_norm_step(cfg, layer.self_block, x_in, y, s_attn, t_dims),
                      rec.ffn_step(cfg, parts["ffn"], t_dims)]
        else:
            later.append(f"layer {n + 1}: mean largest attention weight {float(a.weights.amax(-1).mean()):.2f}, "
                         f"|FFN(x)| / |x| {float(parts['ffn']['out'].norm() / x.norm()):.2f}")
    before = x
    if model.decoder.norm is not None:
        x = model.decoder.norm(x)
    steps.append(rec.layers_step(cfg, model.decoder.norm, before, later, t_dims))
    return x, steps, rotated


# ---- text and JSON -------------------------------------------------------------------------

def to_dict(w: LMWalkthrough) -> dict:
    return {"tokens": w.pieces, "checks": w.checks, "steps": step_dicts(w.steps)}


def format_text(w: LMWalkthrough) -> str:
    out = format_steps(w.steps)
    c = w.checks
    out.append(f"check: step-by-step vs model.decode (explicit attention): max |diff| of the logits "
               f"{c['logits_max_abs_diff']:.1e}" + (" (bit-identical)" if c["bit_identical"] else " (NOT bit-identical)")
               + f"; vs the fused attention kernel that generation uses: {c['fused_max_abs_diff']:.1e}")
    return "\n".join(out)
