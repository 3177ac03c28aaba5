"""Attention maps for one sentence and its translation (or a language model's text), as plain
lists for JSON.

The translation is decoded first (as ``/translate`` would), then source and translation go
through the model once more, teacher-forced, asking for the attention weights: the same
weights the model used for each output token, computed in one pass instead of step by step.

Rows are queries, columns keys:

    encoder_self  [layer][head][S][S]   source token i looks at source token j
    decoder_self  [layer][head][T][T]   producing target token t, looking at decoder input u
    cross         [layer][head][T][S]   producing target token t, looking at source token j

``source_tokens`` (S) are the source subwords plus ``</s>``; ``target_tokens`` (T) are the
produced subwords plus ``</s>``; ``target_input_tokens`` (T) are what the decoder was fed at
each step: ``<s>`` and then the produced subwords.

For a language model (:func:`lm_attention_maps`), a text (a prompt and its continuation)
goes through the model once:

    self_attention  [layer][head][T][T]  token t looks at token u (u <= t: causal)
"""
from __future__ import annotations

from typing import Any

import torch

from ..generator import Generator
from ..translator import Translator

BOS, EOS = "<s>", "</s>"


@torch.inference_mode()
def attention_maps(translator: Translator, text: str, decimals: int = 3) -> dict[str, Any]:
    """The translation of ``text`` and every attention weight behind it.

    An empty (or whitespace-only) text gives an empty translation and empty maps. A text
    longer than the model can take is cut exactly as :class:`Translator` cuts it.
    """
    model, cfg = translator.model, translator.model.cfg
    empty = {"translation": "", "score": 0.0, "source_tokens": [], "target_tokens": [],
             "target_input_tokens": [], "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
             "encoder_self": [], "decoder_self": [], "cross": []}
    if not text.strip():
        return empty
    best = translator.translate_nbest([text], 1)[0][0]
    src_ids = translator.encode(text)  # subwords + EOS, cut to the model's limit
    tgt_out = best.tokens + [cfg.eos_id]  # what the decoder produced
    tgt_in = [cfg.bos_id] + best.tokens  # what it was fed

    device = translator.device
    src = torch.tensor([src_ids], device=device)  # (1, S)
    tgt = torch.tensor([tgt_in], device=device)  # (1, T)
    memory, enc_weights = model.encode(src, return_weights=True)
    _, _, dec_weights = model.decode(tgt, model.start_cache(memory, src), return_weights=True)

    piece = translator.subwords.id_to_piece
    return {
        **empty,
        "translation": best.text,
        "score": best.score,
        "source_tokens": [piece(i) for i in src_ids[:-1]] + [EOS],
        "target_tokens": [piece(i) for i in tgt_out[:-1]] + [EOS],
        "target_input_tokens": [BOS] + [piece(i) for i in tgt_in[1:]],
        "encoder_self": [_rounded(w[0], decimals) for w in enc_weights],  # each (H, S, S)
        "decoder_self": [_rounded(self_w[0], decimals) for self_w, _ in dec_weights],  # (H, T, T)
        "cross": [_rounded(cross_w[0], decimals) for _, cross_w in dec_weights],  # (H, T, S)
    }


@torch.inference_mode()
def lm_attention_maps(generator: Generator, text: str, decimals: int = 3) -> dict[str, Any]:
    """The causal self-attention of a language model over ``text``: its tokens (T) and every
    weight, ``self_attention[layer][head][t][u]``. A text longer than the model's context
    shows its last ``max_len`` tokens (``truncated``); an empty one gives empty maps.

    Raises:
        UserError: ``text`` holds a character the tokenizer does not know (a character model).
    """
    model, cfg = generator.model, generator.model.cfg
    ids = generator.tokenizer.encode(text)
    truncated = len(ids) > cfg.max_len
    ids = ids[-cfg.max_len:]
    out = {"tokens": token_strings(generator.tokenizer, ids), "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
           "self_attention": [], "truncated": truncated}
    if ids:
        device = model.embed.weight.device
        tokens = torch.tensor([ids], device=device)  # (1, T)
        _, _, weights = model.decode(tokens, model.start_cache(1, device), return_weights=True,
                                     real=torch.ones_like(tokens, dtype=torch.bool))  # every id is real, pad's too
        out["self_attention"] = [_rounded(w[0], decimals) for w in weights]  # each (H, T, T)
    return out


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """How each token reads: a character, or a subword piece (with its "▁"; the end of a
    line, EOS, as "\n"); an imported tokenizer's special token by its name, a byte that is
    part of a character as ``<0xF0>`` (its ``shown``)."""
    subwords = getattr(tokenizer, "subwords", None)  # LineSubwords: one line's pieces, EOS for its newline
    if subwords is None:
        shown = getattr(tokenizer, "shown", None)
        return [shown(i) if shown is not None else tokenizer.decode([i]) for i in ids]
    return ["\n" if i == tokenizer.eos_id else subwords.id_to_piece(i) for i in ids]


def _rounded(weights: torch.Tensor, decimals: int) -> list:
    """(H, rows, cols) -> nested lists of floats with ``decimals`` decimals."""
    return weights.double().cpu().round(decimals=decimals).tolist()  # float64: 0.3, not 0.30000001
