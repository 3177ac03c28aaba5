"""A language model's score on a text: cross-entropy (nats per token), perplexity and bits
per byte, the figures ``transformer evaluate --text`` prints.

    model, _ = load_model("runs/shakespeare")
    score = score_text(model, load_tokenizer("runs/shakespeare"), text)
    score.cross_entropy, score.perplexity, score.bits_per_byte

The text is encoded whole (no BOS is added) and every token but the first is scored once,
given the tokens before it: the loss Hugging Face computes as ``model(ids, labels=ids).loss``.
A text longer than the model's context (``max_len``) is scored in windows of the context
that move ``stride`` tokens at a time (Hugging Face's perplexity guide); each window scores
only the tokens the window before did not reach, so a token scored in a later window sees at
least ``context - stride`` tokens before it. The last window ends at the end of the text (a
full window: as much left context as fits). The default stride, half the context, gives
every such token half a context of history at twice the cost of windows that do not
overlap (``stride = context - 1``: consecutive windows share one token).

Bits per byte, ``total nats / ln 2 / UTF-8 bytes of the text``, compares models with
different tokenizers (a character model's bits per character is this figure on ASCII text).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch.nn import functional as F

from ..errors import UserError


@dataclass(frozen=True)
class TextScore:
    """What scoring a text measured; nll is in nats, summed over the scored tokens."""

    nll: float  # total negative log-likelihood of the scored tokens, in nats
    tokens: int  # tokens scored (the text's tokens but the first)
    bytes: int  # UTF-8 bytes of the text
    windows: int  # forward windows the text was scored in
    context: int  # tokens per window
    stride: int  # tokens newly scored per window after the first

    @property
    def cross_entropy(self) -> float:
        """Nats per scored token."""
        return self.nll / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.cross_entropy, 700.0))  # exp overflows a float past ~709

    @property
    def bits_per_byte(self) -> float:
        """Bits per UTF-8 byte of the text (NaN when the byte count is not known)."""
        return self.nll / math.log(2) / self.bytes if self.bytes else math.nan

    def to_dict(self) -> dict:
        return {"cross_entropy": self.cross_entropy, "perplexity": self.perplexity,
                "bits_per_byte": self.bits_per_byte, **asdict(self)}

    def summary(self) -> str:
        return (f"cross-entropy {self.cross_entropy:.4f} nats/token  perplexity {self.perplexity:.2f}  "
                f"bits per byte {self.bits_per_byte:.4f}  ({self.tokens:,} tokens scored, {self.bytes:,} bytes; "
                f"{self.windows} window(s) of {self.context} tokens, stride {self.stride})")


def default_stride(context: int) -> int:
    """Half the context (at least 1)."""
    return max(1, context // 2)


def score_windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int]]:
    """The windows that score tokens ``1 .. n_tokens - 1`` of a stream once each, as
    ``(start, first)``: the window reads tokens ``start .. start + L - 1`` (``L = min(context,
    n_tokens)``) and scores its predictions from position ``first`` on, i.e. the tokens
    ``start + first + 1 .. start + L - 1``. Each window after the first ends ``stride`` tokens
    after the one before it, the last one at the end of the stream.

    Raises:
        ValueError: fewer than 2 tokens, or a stride outside ``1 .. context - 1``.
    """
    if n_tokens < 2:
        raise ValueError(f"a text of {n_tokens} token(s) has nothing to score (it takes 2: one to predict from)")
    if not 1 <= stride <= context - 1:
        raise ValueError(f"stride must be between 1 and the context minus one ({context - 1}), got {stride}")
    length = min(context, n_tokens)
    out = [(0, 0)]
    end = length - 1  # the last token scored so far
    while end < n_tokens - 1:
        new_end = min(end + stride, n_tokens - 1)
        start = new_end - (length - 1)
        out.append((start, end - start))  # predictions from position end - start score token end + 1 on
        end = new_end
    return out


@torch.inference_mode()
def score_ids(model, ids: list[int] | torch.Tensor, stride: int | None = None, max_tokens: int = 4000,
              n_bytes: int = 0) -> TextScore:
    """Score the token ids ``ids`` with ``model`` (a :class:`~transformer.model.LanguageModel`,
    in the dtype and on the device it has) in windows of its context ``cfg.max_len``;
    ``max_tokens``: window tokens per forward pass (at least one window). Every id is a real
    token (none is read as padding). ``n_bytes``: the UTF-8 bytes of the text the ids encode
(for bits per byte)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    context = model.cfg.max_len
    stride = default_stride(context) if stride is None else stride
    spans = score_windows(len(ids), context, stride)
    length = min(context, len(ids))
    device = next(model.parameters()).device
    per_batch = max(1, max_tokens // length)
    positions = torch.arange(length)
    nll = 0.0
    for i in range(0, len(spans), per_batch):
        chunk = spans[i: i + per_batch]
        window = ids[torch.tensor([s for s, _ in chunk])[:, None] + positions]  # (B, L)
        first = torch.tensor([f for _, f in chunk])[:, None]
        scored = (positions >= first) & (positions < length - 1)  # (B, L): predictions that score a token
        targets = window.roll(-1, dims=1)[scored]  # the next token of each scored position
        logits = model(window.to(device), select=scored.to(device), padded=False)  # (N, V)
        losses = F.cross_entropy(logits.float(), targets.to(device), reduction="none")
        nll += float(losses.double().sum())
    return TextScore(nll, len(ids) - 1, n_bytes, len(spans), length, stride)


def _where_unknown(text: str, tokenizer, name: str | None) -> str:
    """"FILE:LINE:COLUMN: " of the first character of ``text`` that ``tokenizer`` (a character
    vocabulary: ``chars``) lacks; "FILE: " alone for another tokenizer."""
    known = set(getattr(tokenizer, "chars", None) or ())
    i = next((i for i, c in enumerate(text) if c not in known), None) if known else None
    if i is None:
        return f"{name}: " if name else ""
    line, column = text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)
    return f"{name}:{line}:{column}: " if name else f"line {line}, column {column}: "


def score_text(model, tokenizer, text: str, stride: int | None = None, max_tokens: int = 4000,
               name: str | None = None) -> TextScore:
    """Cross-entropy, perplexity and bits per byte of ``text`` under ``model``, encoded by
    ``tokenizer`` (its run's: anything with ``encode(text) -> ids`` and ``vocab_size``);
    ``stride`` defaults to half the model's context. See :func:`score_ids`.

    Raises:
        UserError: the text is empty, encodes to fewer than 2 tokens (the message names the
        file ``name`` it came from, if given), or the stride does not fit the context.
    """
    where = f"{name}: " if name else ""
    if not text.strip():
        raise UserError(f"{where}the text is empty; give a text to score")
    try:
        ids = tokenizer.encode(text)
    except UserError as e:  # a character a character vocabulary lacks: where it is in the file
        raise UserError(f"{_where_unknown(text, tokenizer, name)}{e}") from None
    if len(ids) < 2:
        raise UserError(f"{where}a text of {len(ids)} token(s) has nothing to score (it takes 2: one to predict "
                        "from); give a longer text")
    if ids and max(ids) >= model.cfg.vocab_size:
        raise UserError(f"the tokenizer gives id {max(ids)} but the model has {model.cfg.vocab_size} rows; "
                        "the tokenizer is not this model's")
    try:
        return score_ids(model, ids, stride, max_tokens, len(text.encode("utf-8")))
    except ValueError as e:
        raise UserError(str(e)) from None
