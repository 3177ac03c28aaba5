"""Text in, text out for a language model run: prompts encoded as in training, continued by
:func:`~transformer.decode.sample.generate_stream` (greedy or sampled, batched on the KV
cache), decoded, and streamed piece by piece as the tokens come. :meth:`Generator.pieces` is
the one way from generated tokens to text: the ``generate`` command, this Python API and the
service (``LMService``) all read it.

    generator = Generator.from_pretrained("runs/shakespeare")
    generator.generate(["ROMEO:"])           # -> ["ROMEO:\\nWhat ..."] without the prompt: see below
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from ..decode.decoding_config import DecodingConfig
from ..decode.sample import generate_stream, until_stop
from ..errors import UserError
from .front_door import FrontDoor, given, open_model, run_decoding, vocabulary_fits
from ..model import LanguageModel
from ..run import CONFIG, run_file
from ..run.layout import read_stop_ids


def load_tokenizer(path: str | Path):
    """The tokenizer a language model run was trained with (characters or subwords)."""
    from ..data.text import load_tokenizer as load

    return load(path)


def _pretrained(tokenizer) -> bool:
    """A pretrained model's own tokenizer (``transformer import``), as opposed to one trained here."""
    from ..data.hf_tokenizer import PretrainedTokenizer, SentencePieceTokenizer

    return isinstance(tokenizer, (PretrainedTokenizer, SentencePieceTokenizer))


class TextPieces:
    """One row's text as its tokens come: ``add(token)`` gives the text the token adds
    (possibly "" while a multi-byte character or a subword is incomplete), ``finish()``
    whatever was held back; the pieces join to the decoded ids.

    Only a window of the newest tokens is decoded each time: the tokens not yet shown and
    ``CONTEXT`` before them (so that a subword's leading space, or a character split over
    several byte tokens, decodes as in the whole text). A stream of any length costs the same
    per token and holds no more than the window."""

    CONTEXT = 8

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.window: list[int] = []  # the newest tokens
        self.shown = ""  # the text given out for them (decoded from the window's first token)

    def add(self, token: int) -> str:
        self.window.append(token)
        decoded = self.tokenizer.decode(self.window)
        incomplete = decoded.endswith("\ufffd")  # a character whose bytes have not all come
        stable = decoded[: len(decoded) - 1] if incomplete else decoded
        piece, self.shown = stable[len(self.shown):], stable
        if not incomplete and len(self.window) > 2 * self.CONTEXT:  # slide: keep the context
            self.window = self.window[-self.CONTEXT:]
            self.shown = self.tokenizer.decode(self.window)
        return piece

    def finish(self) -> str:
        final = self.tokenizer.decode(self.window)
        piece, self.shown = final[len(self.shown):], final
        return piece


def refuse_shortlist(decoding: DecodingConfig | None, path=None) -> None:
    """A one-line UserError for a vocabulary shortlist asked of a language model: it restricts a
    translation's output to what its source's tokens co-occur with, and a prompt has no such
    source."""
    if decoding is not None and decoding.shortlist:
        where = f"{path}: " if path is not None else ""
        raise UserError(f"{where}a language model; shortlist is for translation models (set decoding.shortlist: "
                        "false, or drop --shortlist)")


class Generator(FrontDoor):
    """Continue prompts with a trained :class:`~transformer.model.LanguageModel`.

    ``decoding`` gives max_new_tokens, temperature (0 = greedy), top_k, top_p, seed, precision
    and device. A prompt longer than the model's context is cut from the left (its last
    ``max_len - 1`` tokens are kept) with a warning (``warn=False``: counted in ``truncated``);
    an empty prompt starts from a newline (as nanoGPT's sampler does) where the tokenizer has
    one, else from BOS.
    """

    too_long = "a prompt of {n} tokens is longer than the model's context; continuing its last {room} tokens"
    keep_last = True

    def __init__(self, model: LanguageModel, tokenizer, decoding: DecodingConfig | None = None,
                 *, warn: bool = True) -> None:
        refuse_shortlist(decoding)
        super().__init__(model, decoding, warn)
        self.tokenizer = tokenizer
        # a pretrained model ends its text with EOS; a model trained here has none (characters) or
        # uses it for a newline (subwords)
        self.stop_id: int | list[int] | None = self.model.cfg.eos_id if _pretrained(tokenizer) else None

    @classmethod
    def from_pretrained(cls, path: str | Path, *, warn: bool = True, **options) -> "Generator":
        """A generator for a run directory (or a weights file in one); ``options`` are
        :class:`DecodingConfig` fields that override the run's ``decoding`` settings."""
        decoding = run_decoding(path, given(options))
        refuse_shortlist(decoding, path)  # before the weights load
        model = open_model(path, decoding, language_model=True)
        if run_file(path, CONFIG) is None:
            raise UserError(f"{path}: no {CONFIG} beside the weights; give the run directory")
        tokenizer = load_tokenizer(path)
        if not vocabulary_fits(tokenizer.vocab_size, model.cfg.vocab_size, imported=_pretrained(tokenizer)):
            raise UserError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model was built for "
                            f"{model.cfg.vocab_size}; these files belong to different runs")
        generator = cls(model, tokenizer, decoding, warn=warn)
        generator.keep_compiled_steps(path)
        if generator.stop_id is not None:  # an imported model may end its text with any of several ids
            generator.stop_id = read_stop_ids(path, model.cfg.vocab_size) or generator.stop_id
        return generator

    def search_kind(self) -> tuple[int, bool, int]:
        return 1, False, self.decoding.max_new_tokens  # one row per prompt, logits (sampling scales them)

    def encode(self, prompt: str) -> list[int]:
        return self.fit_length(self.tokenizer.encode(prompt) if prompt else
                         (self.tokenizer.encode("\n") or [self.model.cfg.bos_id]))

    def pieces(self, ids: list[list[int]], seed: int | Sequence[int | None] | None = None,
               ) -> Iterator[list[tuple[int | None, str] | None]]:
        """The prompts' tokens ``ids`` (:meth:`encode`) continued with ``decoding``'s sampling
        settings, as text: for each new token, each row's (token, the text it adds, possibly ""
        while a multi-byte character or a subword is incomplete), or None for a row that has
        stopped (its stop token, an imported model's EOS or import.json's ``stop_ids``, was its
        last); then, once, each row's (None, the text held back to the end), where any row held
        some back. ``seed``: one int (row ``i`` draws with ``seed + i``), one per row, or None."""
        d = self.decoding
        rows = [TextPieces(self.tokenizer) for _ in ids]
        tokens = generate_stream(self.model, ids, d.max_new_tokens, d.temperature, d.top_k, d.top_p, seed,
                                 stop_id=self.stop_id, step=self.search_step(len(ids)))
        for step in until_stop(tokens, self.stop_id):
            yield [None if t is None else (t, row.add(t)) for row, t in zip(rows, step)]
        rest = [row.finish() for row in rows]
        if any(rest):
            yield [(None, piece) for piece in rest]

    def stream(self, prompts: list[str], seed_offset: int = 0) -> Iterator[list[str]]:
        """For each new token, the text it adds to each row (:meth:`pieces`; "" for a row that
        has stopped)."""
        seed = None if self.decoding.seed is None else self.decoding.seed + seed_offset
        for step in self.pieces([self.encode(p) for p in prompts], seed):
            yield ["" if piece is None else piece[1] for piece in step]

    @torch.inference_mode()
    def generate(self, prompts: list[str]) -> list[str]:
        """The continuation of each prompt (without the prompt)."""
        out = [""] * len(prompts)
        for pieces in self.stream(prompts):
            out = [o + p for o, p in zip(out, pieces)]
        return out
