"""The walkthrough engine: a model's layers run one sub-layer at a time, keeping what each
computed, for both model kinds (the translation model's encoder and decoder, a language
model's decoder-only stack).

The layers run through the trace (:mod:`transformer.inspect.trace`), which runs each through
the layer's own wiring (``EncoderLayer.sublayers``, ``DecoderLayer.sublayers``: residual
connections and norms) with the trace's recording sub-layers; here its named values are gathered into what the steps read, with the
attention weights times V computed as the model's explicit-attention path computes them, so a
walkthrough's outputs equal that path bit for bit (each walkthrough records that check).

Shape legend: T_q / T_k query / key positions, H heads, H_kv key/value heads, D = d_k head
dim, C = d_model, d_ff the FFN's inner width.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..inspect.trace import Recorder
from ..inspect.trace import run_layer as trace_layer


@dataclass
class AttentionParts:
    """One multi-head attention of one sequence, opened up."""

    q: Tensor  # (1, H, T_q, D) the queries (rotated, with RoPE)
    k: Tensor  # (1, H, T_k, D) the keys (rotated; repeated for each query head under grouped-query attention)
    v: Tensor  # (1, H, T_k, D)
    raw_scores: Tensor  # (1, H, T_q, T_k) Q K^T, before the scaling and the mask
    weights: Tensor  # (1, H, T_q, T_k) softmax(Q K^T / sqrt(d_k) + M)
    concat: Tensor  # (1, T_q, H * D) the heads side by side
    out: Tensor  # (1, T_q, C) concat W_O
    unrotated: tuple[Tensor, Tensor] | None = None  # RoPE only: q (1, H, T, D), k (1, H_kv, T, D) before turning


def opened(mha, values: dict[str, Tensor], p: str) -> AttentionParts:
    """The attention ``p`` ("layer.attn", "layer.cross") of a trace's ``values``, opened up."""
    q = values[f"{p}.q"]
    k, v = mha.expand_kv(values[f"{p}.k"], values[f"{p}.v"])  # (1, H, T_k, D)
    concat = mha.merge_heads(values[f"{p}.head_out"].transpose(1, 2))  # (1, T_q, H * D), what W_O read
    raw = q @ k.transpose(-2, -1)  # (1, H, T_q, T_k): only for step 3a's numbers
    return AttentionParts(q, k, v, raw, values[f"{p}.weights"], concat, values[f"{p}.out"])


def ffn_parts(ffn, values: dict[str, Tensor]) -> dict[str, Tensor]:
    """The FFN of a trace's layer ``values``: "hidden" (1, T, d_ff) after the activation and
    "out" (1, T, C); a gated FFN also "up" (x W_up) and "gate" (x W_gate)."""
    parts = {"hidden": values["layer.ffn.hidden"], "out": values["layer.ffn.out"]}
    if ffn.gate is not None:
        x = values["layer.ffn.in"]
        parts.update(up=ffn.fc1(x), gate=ffn.gate(x))
    return parts


def run_layer(layer, x: Tensor, self_mask: Tensor | None, rotary=None, cross_kv=None, memory_mask=None):
    """EncoderLayer.forward or DecoderLayer.forward on x (1, T, C), sub-layer by sub-layer.

    Args:
        self_mask: the self-attention's mask (padding for the encoder, causal for a decoder).
        rotary: cos, sin of the positions (RoPE), or None.
        cross_kv: a translation decoder's K, V (1, H, S, D) of the memory; None otherwise.
        memory_mask: (1, 1, 1, S) the source mask for the cross-attention.

    Returns:
        the new x (1, T, C) and the parts: "x_in", "self" (:class:`AttentionParts`), "self_sum"
        (x + attention output), "self_out" (the attention output), "cross" (translation decoder),
        "ffn" (:func:`ffn_parts`), "ffn_sum".
    """
    rec = Recorder([], None, None)
    x = trace_layer(rec, "layer", layer, x, self_mask, rotary, cross_kv, memory_mask, explicit=True)
    v = rec.values
    parts = {"x_in": v["layer.resid_pre"], "self": opened(layer.self_attn, v, "layer.attn"),
             "self_sum": v["layer.attn.sum"], "self_out": v["layer.attn.out"], "ffn": ffn_parts(layer.ffn, v),
             "ffn_sum": v["layer.ffn.sum"]}
    if rotary is not None:  # q and k before they were turned, as project_qkv gave them
        parts["self"].unrotated = tuple(layer.self_attn.project_qkv(v["layer.attn.in"])[:2])
    if cross_kv is not None:
        parts["cross"] = opened(layer.cross_attn, v, "layer.cross")
    return x, parts


def run_stack(layers, x: Tensor, self_mask: Tensor | None, rotary=None, cross_kv=None,
              memory_mask=None) -> tuple[Tensor, list[dict]]:
    """Encoder.forward or Decoder.forward's loop (without the final norm): returns the last
    layer's output (1, T, C) and each layer's parts (:func:`run_layer`, plus "x_out", the
    layer's output). ``cross_kv``: one (K, V) per layer, or None."""
    every = []
    for n, layer in enumerate(layers):
        x, parts = run_layer(layer, x, self_mask, rotary, None if cross_kv is None else cross_kv[n], memory_mask)
        parts["x_out"] = x
        every.append(parts)
    return x, every


# ---- text and JSON -------------------------------------------------------------------------

def format_steps(steps: list) -> list[str]:
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


def step_dicts(steps: list) -> list[dict]:
    return [{"step": s.number, "title": s.title, "title_zh": s.title_zh, "formula": s.formula,
             "code": s.code, "shapes": s.shapes, "numbers": s.numbers} for s in steps]
