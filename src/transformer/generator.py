"""Text in, text out for a language model run: prompts encoded as in training, continued by
:func:`~transformer.decode.generate` (greedy or sampled, batched on the KV cache), decoded,
and streamed piece by piece as the tokens come.

    generator = Generator.from_pretrained("runs/shakespeare")
    generator.generate(["ROMEO:"])           # -> ["ROMEO:\\nWhat ..."] without the prompt: see below
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from .decode import static
from .decode.config import DecodingConfig
from .decode.precision import decoding_model
from .decode.sample import generate_stream
from .errors import UserError
from .model import LanguageModel
from .run import load_model, run_file, run_root
from .translator import run_decoding


def load_tokenizer(path: str | Path):
    """The tokenizer a language model run was trained with (characters or subwords)."""
    from .data.text import load_tokenizer as load

    return load(path)


def _pretrained(tokenizer) -> bool:
    """A pretrained model's own tokenizer (``transformer import``), as opposed to one trained here."""
    from .data.hf_tokenizer import PretrainedTokenizer, SentencePieceTokenizer

    return isinstance(tokenizer, (PretrainedTokenizer, SentencePieceTokenizer))


class TextPieces:
    """One row's text as its tokens come: ``add(token)`` gives the text the token adds
    (possibly "" while a multi-byte character or a subword is incomplete), ``finish()``
    whatever was held back, ``text`` all of it so far; the pieces join to the decoded ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        decoded = self.tokenizer.decode(self.ids)
        stable = decoded[: len(decoded) - 1] if decoded.endswith("\ufffd") else decoded  # an incomplete character
        piece, self.text = stable[len(self.text):], stable
        return piece

    def finish(self) -> str:
        final = self.tokenizer.decode(self.ids)
        piece, self.text = final[len(self.text):], final
        return piece


class Generator:
    """Continue prompts with a trained :class:`~transformer.model.LanguageModel`.

    ``decoding`` gives max_new_tokens, temperature (0 = greedy), top_k, top_p, seed, precision
    and device. A prompt longer than the model's context is cut from the left (its last
    ``max_len - 1`` tokens are kept) with a warning (``warn=False``: counted in ``truncated``);
    an empty prompt starts from a newline (as nanoGPT's sampler does) where the tokenizer has
    one, else from BOS.
    """

    def __init__(self, model: LanguageModel, tokenizer, decoding: DecodingConfig | None = None,
                 *, warn: bool = True) -> None:
        self.requested_precision = (decoding or DecodingConfig()).precision  # before auto is resolved
        self.model, self.decoding = decoding_model(model, decoding or DecodingConfig(), warn)
        self.tokenizer = tokenizer
        self.warn = warn
        self.truncated = 0
        # a pretrained model ends its text with EOS; a model trained here has none (characters) or
        # uses it for a newline (subwords)
        self.stop_id: int | list[int] | None = self.model.cfg.eos_id if _pretrained(tokenizer) else None

    @classmethod
    def from_pretrained(cls, path: str | Path, *, warn: bool = True, **options) -> "Generator":
        """A generator for a run directory (or a weights file in one); ``options`` are
        :class:`DecodingConfig` fields that override the run's ``decoding`` settings."""
        decoding = run_decoding(path, {k: v for k, v in options.items() if v is not None})
        model, _ = load_model(path, decoding.device)
        if not model.cfg.decoder_only:
            raise UserError(f"{path}: a translation model; generate needs a language model (use translate)")
        if run_file(path, "config.yaml") is None:
            raise UserError(f"{path}: no config.yaml beside the weights; give the run directory")
        tokenizer = load_tokenizer(path)
        # an imported model's embedding may have more rows than its tokenizer has tokens (Qwen pads it)
        fits = tokenizer.vocab_size <= model.cfg.vocab_size if _pretrained(tokenizer) else \
            tokenizer.vocab_size == model.cfg.vocab_size
        if not fits:
            raise UserError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model was built for "
                            f"{model.cfg.vocab_size}; these files belong to different runs")
        generator = cls(model, tokenizer, decoding, warn=warn)
        static.keep_packages_for(generator.model, run_root(path))
        record = run_root(path) / "import.json"  # an imported model may end its text with any of several ids
        if generator.stop_id is not None and record.is_file():
            try:
                stops = json.loads(record.read_text(encoding="utf-8")).get("stop_ids")
            except (OSError, ValueError, AttributeError):
                stops = None
            if isinstance(stops, list) and stops and all(isinstance(i, int) for i in stops):
                generator.stop_id = stops
        return generator

    def compiles(self) -> tuple[bool, bool]:
        """Whether generation runs through the compiled step (``decoding.compile``: ``on``;
        ``auto`` with the step built already, or for a long generation), and whether that step
        has to be built first (tens of seconds to minutes; kept in the user's cache)."""
        d = self.decoding
        if not static.should_compile(d.compile, self.model, logprobs=False, new_tokens=d.max_new_tokens):
            return False, False
        return True, not static.has_package(self.model, logprobs=False)

    def prepare(self) -> None:
        """Load, or build, the compiled step now (see :meth:`compiles`), not at the first token."""
        static.prepare(self.model, logprobs=False)

    def encode(self, prompt: str) -> list[int]:
        ids = self.tokenizer.encode(prompt) if prompt else (self.tokenizer.encode("\n") or [self.model.cfg.bos_id])
        room = self.model.cfg.max_len - 1
        if len(ids) > room:
            self.truncated += 1
            if self.warn:
                warnings.warn(f"a prompt of {len(ids)} tokens is longer than the model's context; "
                              f"continuing its last {room} tokens", stacklevel=3)
            ids = ids[-room:]
        return ids

    def stream(self, prompts: list[str], seed_offset: int = 0) -> Iterator[list[str]]:
        """For each new token, the text it adds to each row (possibly "" while a multi-byte
        character or a subword is incomplete)."""
        d = self.decoding
        encoded = [self.encode(p) for p in prompts]
        seed = None if d.seed is None else d.seed + seed_offset
        rows = [TextPieces(self.tokenizer) for _ in prompts]
        for token in generate_stream(self.model, encoded, d.max_new_tokens, d.temperature, d.top_k, d.top_p, seed,
                                     stop_id=self.stop_id,
                                     compile=d.compile):
            yield [row.add(t) for row, t in zip(rows, token.tolist())]
        rest = [row.finish() for row in rows]
        if any(rest):
            yield rest

    @torch.inference_mode()
    def generate(self, prompts: list[str]) -> list[str]:
        """The continuation of each prompt (without the prompt)."""
        out = [""] * len(prompts)
        for pieces in self.stream(prompts):
            out = [o + p for o, p in zip(out, pieces)]
        return out
