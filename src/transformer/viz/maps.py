"""The attention weights of one sentence pair, taken from the real model.

The sentence is translated first; the model is then re-run with teacher forcing on
(sentence, translation) with ``return_weights=True``, so the weights are exactly the ones
the model used to produce that translation's probabilities.

Shape legend (one sentence, the batch dimension dropped)
    L  layers    H  heads    S  source subwords + </s>    T  <s> + target subwords
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import UserError

KINDS = ("encoder", "decoder", "cross")
KIND_TITLES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder masked self-attention",
    "cross": "encoder-decoder (cross) attention",
    "self": "causal self-attention",
}
WORD_START = "\u2581"  # sentencepiece's word-start marker


@dataclass(frozen=True)
class Pair:
    """A source sentence and its translation as ids, ready for teacher forcing."""

    source: str
    translation: str
    src_ids: list[int]  # subwords + EOS: exactly what the encoder saw when translating
    tgt_ids: list[int]  # the translation's subwords, without BOS / EOS


class _Shape:
    """What both kinds of maps read off their weights: the number of layers and heads."""

    @property
    def n_layers(self) -> int:
        return self.weights(self.focus_kind).size(0)

    @property
    def n_heads(self) -> int:
        return self.weights(self.focus_kind).size(1)


@dataclass(frozen=True)
class AttentionMaps(_Shape):
    """Per-layer, per-head attention weights of one sentence pair (float32, on the CPU)."""

    source: str
    translation: str
    src_pieces: list[str]  # S column / row labels of the encoder
    tgt_in_pieces: list[str]  # T: <s> + translation, what each decoder position reads
    tgt_out_pieces: list[str]  # T: translation + </s>, what each decoder position predicts
    encoder: Tensor  # (L, H, S, S)
    decoder: Tensor  # (L, H, T, T), zero above the diagonal
    cross: Tensor  # (L, H, T, S)

    kinds: ClassVar[tuple[str, ...]] = KINDS
    focus_kind: ClassVar[str] = "encoder"  # the attention that --focus ranks

    @property
    def longest(self) -> int:
        return max(len(self.src_pieces), len(self.tgt_in_pieces))

    def heading(self) -> list[tuple[str, str]]:
        """(label, text) lines for a picture's title."""
        return [("source", self.source), ("translation", self.translation)]

    def texts(self) -> list[str]:
        """Every text a picture labels with (to choose fonts that have its characters)."""
        return [self.source, self.translation, *self.src_pieces, *self.tgt_out_pieces]

    def weights(self, kind: str) -> Tensor:
        """(L, H, rows, cols) weights of ``kind`` (one of :data:`KINDS`)."""
        return {"encoder": self.encoder, "decoder": self.decoder, "cross": self.cross}[kind]

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of ``kind``: queries down, keys across.

        Cross-attention rows are labelled with the token each position *predicts*, the
        usual way to read an alignment; decoder self-attention rows and columns with the
        tokens the positions read.
        """
        if kind == "encoder":
            return self.src_pieces, self.src_pieces
        if kind == "decoder":
            return self.tgt_in_pieces, self.tgt_in_pieces
        return self.tgt_out_pieces, self.src_pieces


@dataclass(frozen=True)
class PromptMaps(_Shape):
    """Per-layer, per-head causal self-attention of one prompt through a language model
    (float32, on the CPU): the same interface as :class:`AttentionMaps`, one kind ("self")."""

    prompt: str
    pieces: list[str]  # T tokens: rows (queries) and columns (keys)
    self_attn: Tensor  # (L, H, T, T), zero above the diagonal

    kinds: ClassVar[tuple[str, ...]] = ("self",)
    focus_kind: ClassVar[str] = "self"

    @property
    def longest(self) -> int:
        return len(self.pieces)

    @property
    def source(self) -> str:  # the HTML page's first line
        return self.prompt

    @property
    def translation(self) -> None:
        return None

    def weights(self, kind: str) -> Tensor:
        if kind != "self":
            raise UserError(f"a language model has causal self-attention only, not {kind!r}")
        return self.self_attn

    def labels(self, kind: str) -> tuple[list[str], list[str]]:  # noqa: ARG002
        return self.pieces, self.pieces

    def heading(self) -> list[tuple[str, str]]:
        return [("prompt", self.prompt)]

    def texts(self) -> list[str]:
        return [self.prompt, *self.pieces]


@torch.inference_mode()
def collect_prompt_attention(model, prompt: str, ids: list[int], pieces: list[str]) -> PromptMaps:
    """The self-attention weights of ``model`` (a LanguageModel, eval mode) on ``ids``: the
    explicit-attention path of ``decode``, the weights that give its logits. Every id is a
    real token, ``pad_id``'s too (an imported GPT-2 pads with a real token's id)."""
    device = next(model.parameters()).device
    tokens = torch.tensor([ids], device=device)
    real = torch.ones_like(tokens, dtype=torch.bool)  # one prompt: nothing is padding
    _, _, weights = model.decode(tokens, model.start_cache(1, device), return_weights=True, real=real)
    return PromptMaps(prompt, pieces, torch.stack([w[0].float().cpu() for w in weights]))


def prepare_pair(translator, sentence: str, target: str | None = None) -> Pair:
    """Translate ``sentence`` with ``translator`` (or take ``target`` as the translation)
    and return the ids to teacher-force. Raises UserError for an empty sentence."""
    if not sentence.strip():
        raise UserError("the sentence is empty; give some text to look at")
    if "\n" in sentence:
        raise UserError("give one sentence (the text holds a line break)")
    src_ids = translator.encode(sentence)
    room = translator.model.cfg.max_len - 1  # one position for BOS
    if target is None:
        best = translator.translate_nbest([sentence], 1)[0][0]
        tgt_ids, translation = best.tokens[:room], best.text
    else:
        tgt_ids, translation = translator.subwords.encode(target)[:room], target
    return Pair(sentence, translation, src_ids, list(tgt_ids))


@torch.inference_mode()
def collect_attention(model, pair: Pair, id_to_piece) -> AttentionMaps:
    """Teacher-force ``pair`` through ``model`` (in eval mode) and gather every weight.

    Args:
        model: a :class:`~transformer.Transformer`.
        pair: from :func:`prepare_pair`.
        id_to_piece: id -> subword string, for the labels.
    """
    cfg = model.cfg
    device = next(model.parameters()).device
    src = torch.tensor([pair.src_ids], device=device)  # (1, S)
    tgt_in = torch.tensor([[cfg.bos_id, *pair.tgt_ids]], device=device)  # (1, T)
    memory, enc_w = model.encode(src, return_weights=True)
    _, _, dec_w = model.decode(tgt_in, model.start_cache(memory, src), return_weights=True)
    stack = lambda ws: torch.stack([w[0].float().cpu() for w in ws])  # noqa: E731  (L, H, ., .)
    return AttentionMaps(
        source=pair.source,
        translation=pair.translation,
        src_pieces=[id_to_piece(i) for i in pair.src_ids],
        tgt_in_pieces=[id_to_piece(i) for i in tgt_in[0].tolist()],
        tgt_out_pieces=[id_to_piece(i) for i in [*pair.tgt_ids, cfg.eos_id]],
        encoder=stack(enc_w),
        decoder=stack([s for s, _ in dec_w]),
        cross=stack([c for _, c in dec_w]),
    )


# ---- "which heads link 'it' to 'animal'?" --------------------------------------------------

def words(pieces: list[str]) -> list[tuple[str, list[int]]]:
    """Group subword pieces into words: [(word, [piece indices])]. A piece that starts
    with "▁" or is a special token (<s>, </s>) starts a new word."""
    out: list[tuple[str, list[int]]] = []
    for i, p in enumerate(pieces):
        if not out or p.startswith(WORD_START) or _is_special(p) or _is_special(out[-1][0]):
            out.append((p.removeprefix(WORD_START), [i]))
        else:
            out[-1] = (out[-1][0] + p, out[-1][1] + [i])
    return out


def _is_special(word: str) -> bool:
    return word.startswith("<") and word.endswith(">") and len(word) > 2


def find_word(pieces: list[str], word: str) -> list[int]:
    """Piece indices of the first word equal to ``word`` (case-insensitive); else of the first
    equal to it without the punctuation around it ("tired." for tired, "world," for world),
    less the pieces that are punctuation only (the comma is not what was asked about)."""
    wanted, found = word.strip().lower(), words(pieces)
    for w, idx in found:
        if w.lower() == wanted:
            return idx
    for w, idx in found:
        if wanted and _bare(w).lower() == wanted:
            return [i for i in idx if _bare(pieces[i].removeprefix(WORD_START))] or idx
    known = " ".join(w for w, _ in found)
    raise UserError(f"{word!r} is not a word of the text (its words: {known})")


def _bare(text: str) -> str:
    """``text`` without the punctuation at its ends (Unicode's P* categories: ,.;!?"'«»...)."""
    import unicodedata

    start, end = 0, len(text)
    while start < end and unicodedata.category(text[start]).startswith("P"):
        start += 1
    while end > start and unicodedata.category(text[end - 1]).startswith("P"):
        end -= 1
    return text[start:end]


@dataclass(frozen=True)
class HeadLink:
    """How much one encoder head makes ``word`` attend to ``target``."""

    layer: int  # counted from 1
    head: int  # counted from 1
    weight: float  # attention from word to target, summed over target pieces, mean over word pieces
    top_word: str  # the word this head makes ``word`` attend to most (itself included)
    top_weight: float
    contrast: float | None = None  # the same weight towards a contrasting word, if one was given


def rank_heads(maps: AttentionMaps | PromptMaps, word: str, target: str, contrast: str | None = None) -> list[HeadLink]:
    """Every encoder head (a language model: every self-attention head), ranked by how
    strongly ``word`` attends to ``target`` (and, for comparison, to ``contrast``: "it" ->
    "animal" rather than "street"). A causal model's query is the word's last token, the
    first that has read all of it; a bare space token ("▁", characters) belongs to no word."""
    pieces = maps.labels(maps.focus_kind)[1]
    causal = maps.focus_kind == "self"
    find = (lambda w: _without_spaces(pieces, find_word(pieces, w))) if causal else (lambda w: find_word(pieces, w))
    rows, cols = find(word), find(target)
    rows = rows[-1:] if causal else rows
    other = find(contrast) if contrast is not None else None
    for option, name, idx in (("--to", target, cols), ("--vs", contrast, other)):
        if causal and idx is not None and idx[0] > rows[-1]:  # every weight would be 0: the mask removes them
            raise UserError(f"{option} {name!r} comes after --focus {word!r} in the text; a language model's token "
                            "attends only to itself and the tokens before it (focus on the later word)")
    w = maps.weights(maps.focus_kind)[:, :, rows, :].mean(dim=2)  # (L, H, S): the word's attention row
    groups = words(pieces)
    if causal:
        groups = [(g, _without_spaces(pieces, idx)) for g, idx in groups]
    per_word = torch.stack([w[..., idx].sum(-1) for _, idx in groups], dim=-1)  # (L, H, n_words)
    links = []
    for layer in range(maps.n_layers):
        for head in range(maps.n_heads):
            top = int(per_word[layer, head].argmax())
            links.append(HeadLink(layer + 1, head + 1, float(w[layer, head, cols].sum()),
                                  groups[top][0], float(per_word[layer, head, top]),
                                  None if other is None else float(w[layer, head, other].sum())))
    return sorted(links, key=lambda h: -h.weight)


def _without_spaces(pieces: list[str], idx: list[int]) -> list[int]:
    kept = [i for i in idx if pieces[i] != WORD_START]
    return kept or idx


def format_links(links: list[HeadLink], word: str, target: str, n_src: int, contrast: str | None = None,
                 heads: str = "encoder") -> str:
    """The ranked table ``transformer attention --focus`` prints; ``n_src``: the keys the
    query row spreads over (uniform attention gives each 1 / n_src)."""
    extra = f"  {word + '->' + contrast:>14}" if contrast else ""
    lines = [f"{heads} heads ranked by attention from {word!r} to {target!r} "
             f"(layers and heads counted from 1; uniform attention would give about {1 / n_src:.3f} per piece)",
             f"{'rank':>4}  {'layer':>5}  {'head':>4}  {word + '->' + target:>14}{extra}  {word}'s strongest link"]
    for rank, h in enumerate(links, 1):
        more = f"  {h.contrast:>14.3f}" if h.contrast is not None else ""
        lines.append(f"{rank:>4}  {h.layer:>5}  {h.head:>4}  {h.weight:>14.3f}{more}  {h.top_word} ({h.top_weight:.3f})")
    return "\n".join(lines)
