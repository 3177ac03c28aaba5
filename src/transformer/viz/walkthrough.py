"""The forward pass of one sentence pair, step by step, in the article's ten steps.

Every step calls the model's own sub-modules (embedding table, positional table, the
projections and the pure ``attention()`` asked for its weights, LayerNorms, the FFN, the
output projection) through the walkthrough engine (:mod:`.engine`, shared with the language
model's walkthrough), so the recomputed encoder output and logits equal ``model.encode`` /
``model.decode`` (explicit-attention path) bit for bit. The result records that check; the
tests assert it, so this walkthrough cannot drift from the model.

The seed's steps: (1) 词嵌入 embedding, (2) 位置编码 positional encoding, (3) 多头自注意力
multi-head self-attention [3a Q/K/V and scores, 3b scaling and softmax, 3c heads
concatenated and W_O], (4) 残差连接与归一化 Add & Norm, (5) 前馈神经网络 FFN,
(6) 掩码多头注意力 masked self-attention, (7) 交叉注意力 cross-attention, (8) FFN and
Add & Norm again, (9) 线性层 linear, (10) Softmax.

Shape legend: S source tokens, T target positions, H heads, d_k = d_model / H, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import masks
from . import records as rec
from .engine import format_steps, run_stack, step_dicts

__all__ = ["Walkthrough", "walk", "to_dict", "format_text", "format_steps", "step_dicts"]


@dataclass
class Walkthrough:
    source_pieces: list[str]
    target_pieces: list[str]  # decoder inputs: <s> + translation
    steps: list[rec.Record]
    memory: Tensor  # (1, S, d_model) recomputed encoder output
    logits: Tensor  # (1, T, V) recomputed logits
    checks: dict[str, float]  # max |recomputed - model| for memory and logits (0.0 = bit-identical)


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


def _encoder(model, x: Tensor, mask: Tensor, src_p: list[str], s_dims) -> tuple[Tensor, list[rec.Record]]:
    """Encoder.forward: every layer; steps (3a)-(5) recorded for layer 1, a summary line for
    the others. Returns the memory (1, S, C) and the steps."""
    cfg = model.cfg
    x, layers = run_stack(model.encoder.layers, x, mask)
    first, a = layers[0], layers[0]["self"]
    steps = rec.attention_steps(cfg, a, src_p, src_p, s_dims, s_dims, "encoder layer 1")
    steps.append(rec.add_norm_step(model.encoder.layers[0].attn_block, first["x_in"], a.out, first["self_sum"], s_dims,
                                   cfg.d_model))
    steps.append(rec.ffn_step(cfg, model.encoder.layers[0], first["ffn"], first["ffn_sum"], s_dims))
    later = [f"layer {n + 1}: mean max attention weight {float(p['self'].weights.amax(-1).mean()):.2f}, "
             f"FFN units zeroed {rec.zeroed(p['ffn']):.1%}" for n, p in enumerate(layers) if n > 0]
    if model.encoder.norm is not None:
        x = model.encoder.norm(x)
    steps[-1].lines.append(_stack_line(cfg, "memory", s_dims, later))
    steps[-1].numbers["later_layers"] = later
    return x, steps


def _decoder(model, y: Tensor, cache, src_p, tgt_p, s_dims, t_dims) -> tuple[Tensor, list[rec.Record], Tensor]:
    """Decoder.forward on all T positions at once (teacher forcing): steps (6)-(8) recorded
    for layer 1. Returns the decoder output (1, T, C), the steps and the last layer's
    cross-attention weights (H, T, S)."""
    cfg = model.cfg
    T = y.size(1)
    self_mask = None if T == 1 else masks.causal_mask(T, T, y.device)  # (1, 1, T, T), as Decoder.forward
    y, layers = run_stack(model.decoder.layers, y, self_mask, cross_kv=cache.cross_kv, memory_mask=cache.memory_mask)
    first = layers[0]
    steps = [rec.masked_step(cfg, first["self"], tgt_p, t_dims),
             rec.cross_step(cfg, first["cross"], tgt_p, src_p, t_dims, s_dims),
             rec.decoder_ffn_step(cfg, first["ffn"], t_dims)]
    later = [f"layer {n + 1}: FFN units zeroed {rec.zeroed(p['ffn']):.1%}" for n, p in enumerate(layers) if n > 0]
    if model.decoder.norm is not None:
        y = model.decoder.norm(y)
    steps[-1].lines.append(_stack_line(cfg, "decoder output", t_dims, later))
    return y, steps, layers[-1]["cross"].weights[0]


def _stack_line(cfg, output: str, d, later: list[str]) -> str:
    return (f"x N = {cfg.n_layers} layers -> {output} {rec.dims(d, ('d_model', cfg.d_model, None))}"
            + "".join("; " + line for line in later))


# ---- text and JSON -------------------------------------------------------------------------

def to_dict(w: Walkthrough) -> dict:
    return {"source_pieces": w.source_pieces, "decoder_input_pieces": w.target_pieces, "checks": w.checks,
            "steps": step_dicts(w.steps)}


def format_text(w: Walkthrough) -> str:
    out = format_steps(w.steps)
    c = w.checks
    same = c["memory_max_abs_diff"] == 0 and c["logits_max_abs_diff"] == 0
    out.append(f"check: step-by-step vs model.encode / model.decode: max |diff| memory {c['memory_max_abs_diff']:.1e}, "
               f"logits {c['logits_max_abs_diff']:.1e}" + (" (bit-identical)" if same else ""))
    return "\n".join(out)
