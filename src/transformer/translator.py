"""Text in, text out: subwords, batching by length, decoding, order restored."""
from __future__ import annotations

import copy
import filecmp
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .data import Subwords
from .decode import Ensemble, Hypothesis, beam_search, greedy_search, pad_batch
from .decode.precision import check_precision, for_inference
from .model import Transformer


@dataclass(frozen=True)
class Translation:
    text: str
    score: float  # length-normalised log-probability
    tokens: list[int]


def _check_beam(beam_size: int) -> None:
    if beam_size < 1:
        raise ValueError(f"beam size must be at least 1, got {beam_size}")


class Translator:
    """Translate lines with a trained model and the subword model it was trained with.

    Lines are encoded exactly as in training, sorted by length into batches of at most
    ``max_tokens`` source tokens, decoded, and returned in input order. ``model`` may be an
    :class:`~transformer.decode.Ensemble` of models that share ``subwords``. ``precision``
    (fp32, bf16 or int8; see :mod:`transformer.decode.precision`) decodes with a converted
    copy of the model; the model passed in is left as it was. An empty (or
    whitespace-only) line gives an empty translation. A line longer than the model can
    take is cut to its first ``max_len - 1`` subwords with a warning.
    """

    def __init__(self, model: Transformer | Ensemble, subwords: Subwords, beam_size: int = 4, alpha: float = 0.6,
                 max_tokens: int = 4000, max_len_a: float = 1.0, max_len_b: int = 50,
                 device: str | torch.device = "cpu", warn: bool = True, precision: str = "fp32") -> None:
        _check_beam(beam_size)
        self.model = for_inference(model.to(device), precision)
        self.precision = precision
        self.subwords = subwords
        self.beam_size, self.alpha = beam_size, alpha
        self.max_tokens = max_tokens
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.device = torch.device(device)
        self.truncated = 0  # lines cut to fit, over this translator's life
        self.warn = warn  # False: only count them (the CLI prints one summary line)

    def with_beam(self, beam_size: int) -> "Translator":
        """The same translator (the same model, already at its precision) with another beam size."""
        _check_beam(beam_size)
        other = copy.copy(self)
        other.beam_size, other.truncated = beam_size, 0
        return other

    def encode(self, line: str) -> list[int]:
        ids = self.subwords.encode(line)
        room = self.model.cfg.max_len - 1  # one position for EOS
        if len(ids) > room:
            self.truncated += 1
            if self.warn:
                warnings.warn(f"a line of {len(ids)} subwords is longer than the model's limit "
                              f"({room}); translating its first {room} subwords only", stacklevel=3)
            ids = ids[:room]
        return ids + [self.model.cfg.eos_id]

    @torch.inference_mode()
    def translate_nbest(self, lines: list[str], n_best: int = 1) -> list[list[Translation]]:
        """For each line, its ``n_best`` translations, best first."""
        if not 1 <= n_best <= self.beam_size:
            raise ValueError(f"n_best must be between 1 and the beam size ({self.beam_size})")
        results: list[list[Translation]] = [[] for _ in lines]
        todo = [(i, self.encode(line)) for i, line in enumerate(lines) if line.strip()]
        for i, line in enumerate(lines):
            if not line.strip():
                results[i] = [Translation("", 0.0, [])] * n_best
        todo.sort(key=lambda x: len(x[1]))
        start = 0
        while start < len(todo):
            end = start + 1  # grow the batch while its padded size fits the budget
            while end < len(todo) and (end + 1 - start) * len(todo[end][1]) <= self.max_tokens:
                end += 1
            chunk = todo[start:end]
            src = pad_batch([ids for _, ids in chunk], self.model.cfg.pad_id, self.device)
            for (i, _), hyps in zip(chunk, self._decode(src, n_best)):
                results[i] = [self._to_text(h) for h in hyps]
            start = end
        return results

    def translate(self, lines: list[str]) -> list[str]:
        return [r[0].text for r in self.translate_nbest(lines, 1)]

    def _decode(self, src: torch.Tensor, n_best: int) -> list[list[Hypothesis]]:
        if self.beam_size == 1:
            return greedy_search(self.model, src, self.max_len_a, self.max_len_b)
        return beam_search(self.model, src, self.beam_size, self.alpha, n_best, self.max_len_a, self.max_len_b)

    def _to_text(self, h: Hypothesis) -> Translation:
        ids = [t for t in h.tokens if t != self.model.cfg.eos_id]
        return Translation(self.subwords.decode(ids), h.score, ids)


def load_translator(models: str | Path | list[str | Path], **kwargs) -> Translator:
    """A Translator from a run directory (its subword model and its preferred weights:
    averaged, else best, else the latest checkpoint) or from a weights file inside one.
    Several paths decode as an :class:`~transformer.decode.Ensemble`; they must share
    one subword model (e.g. checkpoints of one run)."""
    from .errors import UserError
    from .train.checkpoint import load_model

    paths = [Path(models)] if isinstance(models, (str, Path)) else [Path(p) for p in models]
    if not paths:
        raise UserError("no model given")
    device = kwargs.get("device", "cpu")
    try:  # before loading anything: fail fast
        check_precision(kwargs.get("precision", "fp32"), device)
    except ValueError as e:
        raise UserError(f"--{e}") from None
    loaded, subwords_file = [], None
    for path in paths:
        model, _ = load_model(path, device)
        found = find_subwords(path)
        if subwords_file is None:
            subwords_file = found
        elif found != subwords_file and not filecmp.cmp(found, subwords_file, shallow=False):
            raise UserError(f"{found}: not the subword model of {paths[0]} ({subwords_file}); "
                            "the models of an ensemble must come from one run's subword model")
        loaded.append(model)
    subwords = Subwords.load(subwords_file)
    for path, model in zip(paths, loaded):
        if subwords.vocab_size != model.cfg.target_vocab_size:
            raise UserError(f"{subwords_file}: {subwords.vocab_size} subwords, but the model in {path} was built for "
                            f"{model.cfg.target_vocab_size}; these files belong to different runs")
    return Translator(loaded[0] if len(loaded) == 1 else Ensemble(loaded), subwords, **kwargs)


def find_subwords(path: str | Path) -> Path:
    """The subwords.model of the run that ``path`` (a run directory, a checkpoint or a
    weights file in one) belongs to."""
    from .errors import UserError
    from .train.checkpoint import run_file

    found = run_file(path, "subwords.model")
    if found is None:
        raise UserError(f"{path}: no subwords.model found beside the weights; give the run directory")
    return found
