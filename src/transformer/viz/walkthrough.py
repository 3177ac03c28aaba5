"""The forward pass of one sentence pair, step by step, in the seed article's ten steps.

Every step calls the model's own sub-modules (embedding table, positional table,
``q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj``, LayerNorms, ``fc1`` / ``fc2``, the
output projection) and repeats only the glue between them, in the same order as
:mod:`transformer.model`, so the recomputed encoder output and logits equal
``model.encode`` / ``model.decode`` (explicit-attention path) bit for bit. The result
records that check; the tests assert it, so this walkthrough cannot drift from the model.

The seed's steps: (1) 词嵌入 embedding, (2) 位置编码 positional encoding, (3) 多头自注意力
multi-head self-attention [3a Q/K/V and scores, 3b scaling and softmax, 3c heads
concatenated and W_O], (4) 残差连接与归一化 Add & Norm, (5) 前馈神经网络 FFN,
(6) 掩码多头注意力 masked self-attention, (7) 交叉注意力 cross-attention, (8) FFN and
Add & Norm again, (9) 线性层 linear, (10) Softmax.

Shape legend: S source tokens, T target positions, H heads, d_k = d_model / H, V vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import masks
from . import steps as rec


@dataclass
class Walkthrough:
    source_pieces: list[str]
    target_pieces: list[str]  # decoder inputs: <s> + translation
    steps: list[rec.Step]
    memory: Tensor  # (1, S, d_model) recomputed encoder output
    logits: Tensor  # (1, T, V) recomputed logits
    checks: dict[str, float]  # max |recomputed - model| for memory and logits (0.0 = bit-identical)


# ---- one multi-head attention, opened up ---------------------------------------------------

@dataclass
class AttentionParts:
    q: Tensor  # (1, H, T_q, D)
    k: Tensor  # (1, H, T_k, D)
    v: Tensor
    raw_scores: Tensor  # (1, H, T_q, T_k) Q K^T
    weights: Tensor  # (1, H, T_q, T_k) softmax(Q K^T / sqrt(d_k)), masked
    heads: Tensor  # (1, H, T_q, D) weights @ V
    concat: Tensor  # (1, T_q, d_model)
    out: Tensor  # (1, T_q, d_model) concat @ W_O + b_O


def open_attention(mha, h: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> AttentionParts:
    """MultiHeadAttention.forward and attention() (explicit path), spelled out."""
    q = mha.split_heads(mha.q_proj(h))  # (1, H, T_q, D)
    raw = q @ k.transpose(-2, -1)  # (1, H, T_q, T_k)
    scores = raw / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    heads = weights @ v  # (1, H, T_q, D)
    b, _, t, _ = heads.shape
    concat = heads.transpose(1, 2).reshape(b, t, mha.n_heads * mha.d_head)  # (1, T_q, C)
    return AttentionParts(q, k, v, raw, weights, heads, concat, mha.out_proj(concat))


def sublayer(block, x: Tensor, run: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """SublayerConnection.forward: returns (new x, the residual sum, the sub-layer output)."""
    if block.norm_first:
        y = run(block.norm(x))
        s = x + y
        return s, s, y
    y = run(x)
    s = x + y
    return block.norm(s), s, y


def ffn_parts(ffn, x: Tensor) -> tuple[Tensor, Tensor]:
    """FeedForward.forward: (hidden after the activation (1, T, d_ff), output (1, T, C))."""
    h = ffn.hidden(x)
    return h, ffn.fc2(h)


# ---- the walkthrough -------------------------------------------------------------------------

@torch.inference_mode()
def walk(model, src_ids: list[int], tgt_ids: list[int], id_to_piece: Callable[[int], str]) -> Walkthrough:
    """Run (source, translation) through ``model`` (eval mode) step by step.

    Args:
        src_ids: source subwords + EOS, as the translator encodes them.
        tgt_ids: the translation's subwords (no BOS / EOS); the decoder reads BOS + these.
        id_to_piece: id -> subword string, for labels and the top-5 list.
    """
    cfg = model.cfg
    device = next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)  # (1, S)
    tgt = torch.tensor([[cfg.bos_id, *tgt_ids]], device=device)  # (1, T)
    src_p = [id_to_piece(i) for i in src_ids]
    tgt_p = [id_to_piece(i) for i in tgt[0].tolist()]
    s_dims = ("S", src.size(1), "source tokens")
    t_dims = ("T", tgt.size(1), "target positions")

    # (1), (2): TokenEmbedding.forward and PositionalEncoding.forward (dropout is off in eval mode)
    looked_up = F.embedding(src, model.src_embed.weight)  # (1, S, C)
    x_embed = looked_up * model.src_embed.scale
    pe = model.positions.pe[: src.size(1)].to(x_embed.dtype)  # (S, C)
    steps = [rec.embedding_step(cfg, model.src_embed.scale, looked_up, x_embed, src_p, src_ids, s_dims),
             rec.positions_step(cfg, pe, s_dims)]
    memory, enc_steps = _encoder(model, x_embed + pe, model.src_mask(src), src_p, s_dims)
    steps += enc_steps

    # (6)-(8): the decoder reads <s> + translation, prepared like the source
    y = F.embedding(tgt, model.tgt_embed.weight) * model.tgt_embed.scale
    y = y + model.positions.pe[: tgt.size(1)].to(y.dtype)
    h, dec_steps, last_cross = _decoder(model, y, model.start_cache(memory, src), src_p, tgt_p, s_dims, t_dims)
    steps += dec_steps
    steps[-1].numbers["alignment_last_layer"] = rec.alignment(last_cross, tgt_ids, id_to_piece, src_p, cfg.eos_id)
    steps[-1].lines.append("last layer's cross-attention (mean of heads), each predicted token's strongest source piece: "
                           + rec.clip(steps[-1].numbers["alignment_last_layer"], ", "))

    # (9), (10)
    logits = model.project(h)  # (1, T, V)
    V = cfg.target_vocab_size
    steps += [rec.linear_step(cfg, model, logits, t_dims, V),
              rec.softmax_step(cfg, logits, tgt_p, tgt_ids, id_to_piece, t_dims, V)]

    ref_memory, _ = model.encode(src, return_weights=True)  # the explicit-attention path
    ref_logits, _, _ = model.decode(tgt, model.start_cache(ref_memory, src), return_weights=True)
    checks = {"memory_max_abs_diff": float((memory - ref_memory).abs().max()),
              "logits_max_abs_diff": float((logits - ref_logits).nan_to_num(0.0).abs().max())}  # -inf - -inf
    return Walkthrough(src_p, tgt_p, steps, memory, logits, checks)


def _encoder(model, x: Tensor, mask: Tensor, src_p: list[str], s_dims) -> tuple[Tensor, list[rec.Step]]:
    """Encoder.forward: every layer; steps (3a)-(5) recorded for layer 1, a summary line for
    the others. Returns the memory (1, S, C) and the steps."""
    cfg = model.cfg
    steps, later = [], []
    for n, layer in enumerate(model.encoder.layers):
        parts = {}

        def self_attention(h, layer=layer, parts=parts):
            k, v = layer.self_attn.project_kv(h)  # (1, H, S, D)
            parts["attn"] = open_attention(layer.self_attn, h, k, v, mask)
            return parts["attn"].out

        def feed_forward(h, layer=layer, parts=parts):
            parts["ffn"] = ffn_parts(layer.ffn, h)
            return parts["ffn"][1]

        x_in = x
        x, s_attn, _ = sublayer(layer.attn_block, x, self_attention)
        x, s_ffn, _ = sublayer(layer.ffn_block, x, feed_forward)
        a: AttentionParts = parts["attn"]
        if n == 0:
            steps += rec.attention_steps(cfg, a, src_p, src_p, s_dims, s_dims, "encoder layer 1")
            steps.append(rec.add_norm_step(layer.attn_block, x_in, a.out, s_attn, s_dims, cfg.d_model))
            steps.append(rec.ffn_step(cfg, layer, parts["ffn"], s_ffn, s_dims))
        else:
            later.append(f"layer {n + 1}: mean max attention weight {float(a.weights.amax(-1).mean()):.2f}, "
                         f"FFN units zeroed {float((parts['ffn'][0] == 0).float().mean()):.1%}")
    if model.encoder.norm is not None:
        x = model.encoder.norm(x)
    steps[-1].lines.append(f"x N = {cfg.n_layers} layers -> memory {rec.dims(s_dims, ('d_model', cfg.d_model, None))}"
                           + "".join("; " + line for line in later))
    steps[-1].numbers["later_layers"] = later
    return x, steps


def _decoder(model, y: Tensor, cache, src_p, tgt_p, s_dims, t_dims) -> tuple[Tensor, list[rec.Step], Tensor]:
    """Decoder.forward on all T positions at once (teacher forcing): steps (6)-(8) recorded
    for layer 1. Returns the decoder output (1, T, C), the steps and the last layer's
    cross-attention weights (H, T, S)."""
    cfg = model.cfg
    T = y.size(1)
    self_mask = None if T == 1 else masks.causal_mask(T, T, y.device)  # (1, 1, T, T), as Decoder.forward
    steps, later = [], []
    for n, (layer, cross_kv) in enumerate(zip(model.decoder.layers, cache.cross_kv)):
        parts = {}

        def masked(h, layer=layer, parts=parts):
            k, v = layer.self_attn.project_kv(h)  # (1, H, T, D)
            parts["self"] = open_attention(layer.self_attn, h, k, v, self_mask)
            return parts["self"].out

        def cross(h, layer=layer, parts=parts, kv=cross_kv):
            parts["cross"] = open_attention(layer.cross_attn, h, kv[0], kv[1], cache.memory_mask)
            return parts["cross"].out

        def feed_forward(h, layer=layer, parts=parts):
            parts["ffn"] = ffn_parts(layer.ffn, h)
            return parts["ffn"][1]

        y, _, _ = sublayer(layer.self_block, y, masked)
        y, _, _ = sublayer(layer.cross_block, y, cross)
        y, _, _ = sublayer(layer.ffn_block, y, feed_forward)
        if n == 0:
            steps += [rec.masked_step(cfg, parts["self"], tgt_p, t_dims),
                      rec.cross_step(cfg, parts["cross"], tgt_p, src_p, t_dims, s_dims),
                      rec.decoder_ffn_step(cfg, parts["ffn"], t_dims)]
        else:
            later.append(f"layer {n + 1}: FFN units zeroed {float((parts['ffn'][0] == 0).float().mean()):.1%}")
    if model.decoder.norm is not None:
        y = model.decoder.norm(y)
    steps[-1].lines.append(f"x N = {cfg.n_layers} layers -> decoder output {rec.dims(t_dims, ('d_model', cfg.d_model, None))}"
                           + "".join("; " + line for line in later))
    return y, steps, parts["cross"].weights[0]


# ---- text and JSON -------------------------------------------------------------------------

def to_dict(w: Walkthrough) -> dict:
    return {"source_pieces": w.source_pieces, "decoder_input_pieces": w.target_pieces, "checks": w.checks,
            "steps": step_dicts(w.steps)}


def format_steps(steps: list[rec.Step]) -> list[str]:
    """Each step as a block of text lines (title, formula, code, shapes, numbers), then a blank."""
    out = []
    for s in steps:
        out.append(f"({s.number}) {s.title_zh} / {s.title}")
        out.append(f"    formula: {s.formula}")
        out.append(f"    code:    {s.code}")
        out += [f"    shape:   {line}" for line in s.shapes]
        out += [f"    {line}" for line in s.lines]
        out.append("")
    return out


def step_dicts(steps: list[rec.Step]) -> list[dict]:
    return [{"step": s.number, "title": s.title, "title_zh": s.title_zh, "formula": s.formula,
             "code": s.code, "shapes": s.shapes, "numbers": s.numbers} for s in steps]


def format_text(w: Walkthrough) -> str:
    out = format_steps(w.steps)
    c = w.checks
    same = c["memory_max_abs_diff"] == 0 and c["logits_max_abs_diff"] == 0
    out.append(f"check: step-by-step vs model.encode / model.decode: max |diff| memory {c['memory_max_abs_diff']:.1e}, "
               f"logits {c['logits_max_abs_diff']:.1e}" + (" (bit-identical)" if same else ""))
    return "\n".join(out)
