"""A prompt through a decoder-only language model, step by step, in the article's terms: the
embedding We, positions (learned, sinusoidal, or the rotation of q and k), masked
self-attention (Q, K, V, scores, causal mask, softmax, WO), Add & Norm, the FFN (gated:
W_gate, W_up, W_down), the final norm, Whead, softmax and the next token.

Every step calls the model's own sub-modules (``embed``, ``positions`` / ``rotary``, the
projections and the pure ``attention()`` asked for its weights, the norms, the FFN,
``project``) through the walkthrough engine (:mod:`.engine`, shared with the translation
model's walkthrough), in the order of :meth:`LanguageModel.hidden` and
:class:`~transformer.model.layers.DecoderLayer`, so the recomputed logits equal
``model.decode(..., return_weights=True)`` (the explicit-attention path) bit for bit; the
result records that check and the tests assert it.

Shape legend: T prompt tokens, H heads, d_k = d_model / H, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import masks
from ..model.embedding import LearnedPositions
from . import records_lm as rec
from .engine import format_steps, run_stack, step_dicts
from .records import positions_step

STEPS = ["1", "2", "3a", "3b", "3c", "4", "5", "6", "7", "8", "9"]


SPECIAL = {0: "<pad>", 1: "<s>", 2: "</s>"}


def token_shower(tokenizer) -> Callable[[int], str]:
    """id -> a printable token of a language model's ``tokenizer``: a character (a space as
    "▁", a newline as "\\n"), or a subword piece (the newline token EOS as "\\n"). An
    imported tokenizer's special token is shown by its own name (``<|begin_of_text|>``, not
    our ``<s>``), and a token that holds part of a character (byte-level BPE splits an emoji)
    by its bytes (``<0xF0><0x9F>``), not as U+FFFD (the tokenizer's ``shown``)."""
    subwords = getattr(tokenizer, "subwords", None)
    if subwords is not None:  # LineSubwords: EOS stands for a newline
        return lambda i: "\\n" if i == tokenizer.eos_id else subwords.id_to_piece(int(i))

    sp = getattr(tokenizer, "sp", None)  # a sentencepiece model: decode drops a lone piece's leading space
    text = getattr(tokenizer, "shown", None) or (lambda i: tokenizer.decode([i]))

    def show(i: int) -> str:
        i = int(i)
        c = text(i)
        if len(c) > 1 and c[0] == " ":  # a byte-level token that starts a word: " world"
            c = "▁" + c[1:]
        elif sp is not None and c.strip() and sp.id_to_piece(i).startswith("▁"):
            c = "▁" + c
        return _visible({"": SPECIAL.get(i, "?"), " ": "▁"}.get(c, c))

    return show


ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible(token: str) -> str:
    """``token`` safe to print: a newline, tab or carriage return as ``\\n``, ``\\t``, ``\\r``,
    any other control character as its byte (``<0x1B>``: byte-level BPE has a token for each,
    and ESC would drive the terminal)."""
    if token.isprintable():
        return token
    import unicodedata

    return "".join(ESCAPES.get(ch) or (f"<0x{ord(ch):02X}>" if unicodedata.category(ch) == "Cc" else ch)
                   for ch in token)


@dataclass
class LMWalkthrough:
    pieces: list[str]
    steps: list
    logits: Tensor  # (1, T, V) recomputed logits
    checks: dict[str, float | bool]


@torch.inference_mode()
def walk_lm(model, ids: list[int], show: Callable[[int], str], decoding) -> LMWalkthrough:
    """Run the prompt ``ids`` through ``model`` (a LanguageModel in eval mode) step by step.

    Args:
        ids: the prompt's token ids (1 .. max_len of them), as the tokenizer encodes it; every one is a
            real token, pad_id's too.
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

    x, layer_steps, first = _layers(model, x, rotary, pieces, t_dims)
    if rotary is not None:
        steps.append(rec.rotary_step(cfg, model.rotary, *first.unrotated, first.q, t_dims))
    steps += layer_steps

    logits = model.project(x)  # (1, T, V)
    steps += [rec.head_step(cfg, model, logits, t_dims), rec.softmax_step(logits, ids, show, t_dims, cfg.vocab_size),
              rec.choice_step(logits, show, decoding)]

    # one prompt, every id a real token (pad_id's too: an imported GPT-2 pads with a real token's id)
    real = torch.ones_like(tokens, dtype=torch.bool)
    ref, _, _ = model.decode(tokens, model.start_cache(1, device), return_weights=True, real=real)  # explicit attention
    fused = model(tokens, padded=False)  # what generation runs: torch's fused attention where it is faster
    checks = {"logits_max_abs_diff": float((logits - ref).abs().max()), "bit_identical": bool(torch.equal(logits, ref)),
              "fused_max_abs_diff": float((logits - fused).abs().max())}
    return LMWalkthrough(pieces, steps, logits, checks)


def _layers(model, x: Tensor, rotary, pieces: list[str], t_dims):
    """Decoder.forward: every layer; steps (3a)-(5) recorded for layer 1, a line for each of
    the others, (6) for the stack and the final norm. Returns the final hidden states
    (1, T, C), the steps and layer 1's attention (``engine.AttentionParts``)."""
    cfg = model.cfg
    T = x.size(1)
    mask = None if T == 1 else masks.causal_mask(T, T, x.device)  # (1, 1, T, T), as Decoder.forward
    before, layers = run_stack(model.decoder.layers, x, mask, rotary)
    first, a = layers[0], layers[0]["self"]
    steps = [rec.scores_step(cfg, a, pieces, t_dims), rec.mask_softmax_step(cfg, a, pieces, t_dims),
             rec.concat_step(cfg, a, t_dims),
             rec.add_norm_step(cfg, model.decoder.layers[0].self_block, first["x_in"], first["self_out"],
                               first["self_sum"], t_dims),
             rec.ffn_step(cfg, first["ffn"], t_dims)]
    later = [f"layer {n + 1}: mean largest attention weight {float(p['self'].weights.amax(-1).mean()):.2f}, "
             f"|FFN(x)| / |x| {float(p['ffn']['out'].norm() / p['x_out'].norm()):.2f}"
             for n, p in enumerate(layers) if n > 0]
    x = before if model.decoder.norm is None else model.decoder.norm(before)
    steps.append(rec.layers_step(cfg, model.decoder.norm, before, later, t_dims))
    return x, steps, a


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
