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

A request may ask for some layers and heads only (``layers``, ``heads``: 0-based indices;
the maps then hold those, in that order). What one answer may cost is bounded
(:class:`Bounds`): the weights it returns (the selected layers x heads x the maps' cells),
and the weights the model computes for it (every layer and head). A text over either bound
is refused (:class:`TooMuchAttention`) before the maps are computed. The service's answer is
JSON built a row at a time (:func:`maps_json`), so building it never holds the interpreter
for long (the server's other requests, ``/health`` too, are answered meanwhile).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from ..inference.generator import Generator
from ..inference.translator import Translator

BOS, EOS = "<s>", "</s>"
# What the model computes for an answer may be this many times the weights the answer returns:
# the selected layers and heads come out of a pass that computes all of them.
COMPUTE_FACTOR = 8


class TooMuchAttention(ValueError):
    """A text whose attention is over the bounds (the message says which and what to do)."""


@dataclass(frozen=True)
class Bounds:
    """Which maps an answer holds and how large it may be.

    Args:
        layers, heads: the 0-based layers and heads to return, in order (None: all).
        max_weights: the most weights one answer may return (None: no bound); the model may
            compute ``COMPUTE_FACTOR`` times as many for it.
    """

    layers: list[int] | None = None
    heads: list[int] | None = None
    max_weights: int | None = None

    def chosen(self, cfg) -> tuple[list[int], list[int]]:
        return (list(range(cfg.n_layers)) if self.layers is None else list(self.layers),
                list(range(cfg.n_heads)) if self.heads is None else list(self.heads))

    def check(self, cfg, cells: int, what: str) -> None:
        """TooMuchAttention when maps of ``cells`` (the sum of rows x columns of each kind of
        map) are over the bounds; ``what`` names the text's size for the message."""
        if self.max_weights is None:
            return
        layers, heads = self.chosen(cfg)
        returned, computed = len(layers) * len(heads) * cells, cfg.n_layers * cfg.n_heads * cells
        if returned > self.max_weights:
            fewer = ('ask for fewer "layers" or "heads" (e.g. "layers": [0], "heads": [0]), or send a shorter text'
                     if len(layers) * len(heads) > 1 else "send a shorter text")
            raise TooMuchAttention(f"the attention of {what} is {returned:,} weights ({_count(len(layers), 'layer')} x "
                                   f"{_count(len(heads), 'head')} x {cells:,}); this server returns at most "
                                   f"{self.max_weights:,} in one answer: {fewer}")
        if computed > COMPUTE_FACTOR * self.max_weights:
            raise TooMuchAttention(f"the attention of {what} takes {computed:,} weights to compute "
                                   f"({_count(cfg.n_layers, 'layer')} x {_count(cfg.n_heads, 'head')} x {cells:,}); "
                                   "this server computes at most "
                                   f"{COMPUTE_FACTOR * self.max_weights:,} for one answer: send a shorter text")


@torch.inference_mode()
def attention_maps(translator: Translator, text: str, decimals: int = 3, bounds: Bounds = Bounds()) -> dict[str, Any]:
    """The translation of ``text`` and every attention weight behind it (the ``bounds``'
    layers and heads), as nested lists.

    An empty (or whitespace-only) text gives an empty translation and empty maps. A text
    longer than the model can take is cut exactly as :class:`Translator` cuts it.

    Raises:
        TooMuchAttention: the maps are over ``bounds`` (checked before they are computed).
    """
    return _listed(_translation_maps(translator, text, bounds), decimals)


@torch.inference_mode()
def lm_attention_maps(generator: Generator, text: str, decimals: int = 3, bounds: Bounds = Bounds()) -> dict[str, Any]:
    """The causal self-attention of a language model over ``text``: its tokens (T) and every
    weight, ``self_attention[layer][head][t][u]`` (the ``bounds``' layers and heads). A text
    longer than the model's context shows its last ``max_len`` tokens (``truncated``); an
    empty one gives empty maps.

    Raises:
        UserError: ``text`` holds a character the tokenizer does not know (a character model).
        TooMuchAttention: the maps are over ``bounds`` (checked before they are computed).
    """
    return _listed(_lm_maps(generator, text, bounds), decimals)


def maps_json(answer: dict[str, Any], decimals: int = 3) -> str:
    """An answer of :func:`attention_maps_tensors` as JSON text: what ``json.dumps`` makes of
    the same answer from :func:`attention_maps`, built a row of a map at a time. Each piece is
    a short call, so the server's other threads run between them (one ``json.dumps`` of the
    whole answer holds the interpreter until it is done)."""
    def head(weights: torch.Tensor) -> str:  # (rows, cols)
        return "[" + ",".join(json.dumps(row, separators=COMPACT) for row in _rounded(weights, decimals)) + "]"

    parts = []
    for key, value in answer.items():
        text = ("[" + ",".join("[" + ",".join(head(h) for h in layer) + "]" for layer in value) + "]"
                if key in MAP_KEYS else json.dumps(value, separators=COMPACT, ensure_ascii=False))
        parts.append(f"{json.dumps(key)}:{text}")
    return "{" + ",".join(parts) + "}"


MAP_KEYS = ("encoder_self", "decoder_self", "cross", "self_attention")
COMPACT = (",", ":")  # JSON without spaces, as the service's other answers


def attention_maps_tensors(model_front: Translator | Generator, text: str, bounds: Bounds = Bounds()) -> dict[str, Any]:
    """:func:`attention_maps` (a Translator) or :func:`lm_attention_maps` (a Generator) with
    the maps as tensors, each layer's (heads, rows, columns): what :func:`maps_json` writes."""
    if isinstance(model_front, Generator):
        return _lm_maps(model_front, text, bounds)
    return _translation_maps(model_front, text, bounds)


def _translation_maps(translator: Translator, text: str, bounds: Bounds) -> dict[str, Any]:
    model, cfg = translator.model, translator.model.cfg
    layers, heads = bounds.chosen(cfg)
    empty = {"translation": "", "score": 0.0, "source_tokens": [], "target_tokens": [],
             "target_input_tokens": [], "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
             **_selection(bounds, layers, heads), "encoder_self": [], "decoder_self": [], "cross": []}
    if not text.strip():
        return empty
    src_ids = translator.encode(text)  # subwords + EOS, cut to the model's limit
    s = len(src_ids)
    bounds.check(cfg, s * s + 2 * s, f"a text of {s} tokens")  # the least its maps can be: a one-token translation
    best = translator.translate_nbest([text], 1)[0][0]
    tgt_out = best.tokens + [cfg.eos_id]  # what the decoder produced
    tgt_in = [cfg.bos_id] + best.tokens  # what it was fed
    t = len(tgt_in)
    bounds.check(cfg, s * s + t * t + t * s, f"a text of {s} tokens and its translation of {t}")

    device = translator.device
    src = torch.tensor([src_ids], device=device)  # (1, S)
    tgt = torch.tensor([tgt_in], device=device)  # (1, T)
    memory, enc_weights = model.encode(src, return_weights=True)
    _, _, dec_weights = model.decode(tgt, model.start_cache(memory, src), return_weights=True)

    piece = translator.subwords.id_to_piece
    pick = lambda ws: [ws[i][0, heads] for i in layers]  # noqa: E731 - each (H_chosen, rows, cols)
    return {
        **empty,
        "translation": best.text,
        "score": best.score,
        "source_tokens": [piece(i) for i in src_ids[:-1]] + [EOS],
        "target_tokens": [piece(i) for i in tgt_out[:-1]] + [EOS],
        "target_input_tokens": [BOS] + [piece(i) for i in tgt_in[1:]],
        "encoder_self": pick(enc_weights),  # each (H, S, S)
        "decoder_self": pick([self_w for self_w, _ in dec_weights]),  # (H, T, T)
        "cross": pick([cross_w for _, cross_w in dec_weights]),  # (H, T, S)
    }


def _lm_maps(generator: Generator, text: str, bounds: Bounds) -> dict[str, Any]:
    model, cfg = generator.model, generator.model.cfg
    layers, heads = bounds.chosen(cfg)
    ids = generator.tokenizer.encode(text)
    truncated = len(ids) > cfg.max_len
    ids = ids[-cfg.max_len:]
    bounds.check(cfg, len(ids) ** 2, f"a text of {len(ids)} tokens")
    out = {"tokens": token_strings(generator.tokenizer, ids), "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
           **_selection(bounds, layers, heads), "self_attention": [], "truncated": truncated}
    if ids:
        device = model.embed.weight.device
        tokens = torch.tensor([ids], device=device)  # (1, T)
        _, _, weights = model.decode(tokens, model.start_cache(1, device), return_weights=True,
                                     real=torch.ones_like(tokens, dtype=torch.bool))  # every id is real, pad's too
        out["self_attention"] = [weights[i][0, heads] for i in layers]  # each (H_chosen, T, T)
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _selection(bounds: Bounds, layers: list[int], heads: list[int]) -> dict[str, list[int]]:
    """The answer's record of the layers and heads it holds, when the request chose them."""
    chosen = {}
    if bounds.layers is not None:
        chosen["layers"] = layers
    if bounds.heads is not None:
        chosen["heads"] = heads
    return chosen


def _listed(answer: dict[str, Any], decimals: int) -> dict[str, Any]:
    return {k: [[_rounded(h, decimals) for h in layer] for layer in v] if k in MAP_KEYS else v
            for k, v in answer.items()}


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
    """(rows, cols) -> nested lists of floats with ``decimals`` decimals."""
    return weights.double().cpu().round(decimals=decimals).tolist()  # float64: 0.3, not 0.30000001
