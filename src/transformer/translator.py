"""Text in, text out: subwords, batching by length, decoding, order restored."""
from __future__ import annotations

import copy
import filecmp
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .data import Subwords
from .data.marian_tokenizer import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB, MarianSubwords
from .decode import Ensemble, Hypothesis, beam_search, greedy_search, pad_batch, static
from .decode.config import DecodingConfig
from .decode.precision import decoding_model
from .errors import UserError
from .model import Transformer
from .run import CONFIG, find_subwords, load_model, read_run_config, run_file, run_root


@dataclass(frozen=True)
class Translation:
    text: str
    score: float  # length-normalised log-probability
    tokens: list[int]


class Translator:
    """Translate lines with a trained model and the subword model it was trained with.

    Lines are encoded exactly as in training, sorted by length into batches of at most
    ``decoding.max_tokens`` source tokens, decoded (``decoding.beam`` 1: greedy search,
    else beam search), and returned in input order. ``model`` may be an
    :class:`~transformer.decode.Ensemble` of models that share ``subwords``.
    ``decoding.precision`` (fp32, bf16 or int8; see :mod:`transformer.decode.precision`)
    decodes with a converted copy of the model; the model passed in is left as it was. An
    empty (or whitespace-only) line gives an empty translation. A line longer than the model
    can take is cut to its first ``max_len - 1`` subwords with a warning (``warn=False``:
    only counted in ``truncated``).

        translator = Translator.from_pretrained("runs/demo")   # the run's own decoding settings
        translator.translate(["A dog runs."])
    """

    def __init__(self, model: Transformer | Ensemble, subwords: Subwords | MarianSubwords,
                 decoding: DecodingConfig | None = None, *, warn: bool = True) -> None:
        self.requested_precision = (decoding or DecodingConfig()).precision  # before auto is resolved
        self.model, self.decoding = decoding_model(model, decoding or DecodingConfig(), warn)
        self.subwords = subwords
        self.device = torch.device(self.decoding.device)
        self.truncated = 0  # lines cut to fit, over this translator's life
        self.warn = warn

    @classmethod
    def from_pretrained(cls, path: str | Path | list[str | Path], *, warn: bool = True, **options) -> "Translator":
        """A translator for a run directory (or a weights file in one; several: an
        ensemble), decoding as the run's recipe does unless ``options`` (fields of
        :class:`DecodingConfig`, e.g. ``beam=1``) say otherwise."""
        return load_translator(path, warn=warn, **options)

    def with_decoding(self, **changes) -> "Translator":
        """The same translator (the same model, already converted) with other search settings."""
        if {"precision", "device"} & set(changes):
            raise ValueError("with_decoding: precision and device need a new Translator (the model is converted)")
        other = copy.copy(self)
        other.decoding, other.truncated = self.decoding.replace(**changes), 0
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
    def translate_nbest(self, lines: list[str], n_best: int | None = None,
                        progress: Callable[[int], object] | None = None) -> list[list[Translation]]:
        """For each line, its ``n_best`` (default ``decoding.n_best``) translations, best first.
        ``progress(n)`` is called as each batch (and the empty lines, at once) is done, with
        the number of lines it finished."""
        n_best = self.decoding.n_best if n_best is None else n_best
        if not 1 <= n_best <= self.decoding.beam:
            raise ValueError(f"n_best must be between 1 and the beam size ({self.decoding.beam})")
        results: list[list[Translation]] = [[] for _ in lines]
        todo = [(i, self.encode(line)) for i, line in enumerate(lines) if line.strip()]
        for i, line in enumerate(lines):
            if not line.strip():
                results[i] = [Translation("", 0.0, [])] * n_best
        if progress is not None and len(todo) < len(lines):
            progress(len(lines) - len(todo))
        todo.sort(key=lambda x: len(x[1]))
        start = 0
        while start < len(todo):
            end = start + 1  # grow the batch while its padded size fits the budget
            while end < len(todo) and (end + 1 - start) * len(todo[end][1]) <= self.decoding.max_tokens:
                end += 1
            chunk = todo[start:end]
            src = pad_batch([ids for _, ids in chunk], self.model.cfg.pad_id, self.device)
            for (i, _), hyps in zip(chunk, self._decode(src, n_best)):
                results[i] = [self._to_text(h) for h in hyps]
            if progress is not None:
                progress(len(chunk))
            start = end
        return results

    def translate(self, lines: list[str], progress: Callable[[int], object] | None = None) -> list[str]:
        return [r[0].text for r in self.translate_nbest(lines, 1, progress)]

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 2000, n_best: int | None = None,
                         progress: Callable[[int], object] | None = None) -> Iterator[list[list[Translation]]]:
        """Translate an input of any length in bounded memory: ``chunk_lines`` lines at a
        time, each chunk sorted by length into batches as :meth:`translate_nbest` does, and
        yielded (in input order) before the next one is read. The results equal those of
        ``translate_nbest(list(lines))`` for any chunk size (a batch's padding does not
        change a sentence's translation); smaller chunks only make fuller batches rarer."""
        if chunk_lines < 1:
            raise ValueError(f"chunk_lines must be positive, got {chunk_lines}")
        it = iter(lines)
        while chunk := list(itertools.islice(it, chunk_lines)):
            yield self.translate_nbest(chunk, n_best, progress)

    def compiles(self) -> tuple[bool, bool]:
        """Whether the search runs through the compiled step
        (:func:`~transformer.decode.static.should_compile` of ``decoding.compile``: ``on``, or
        ``auto`` with the step built already; batches of more than
        :data:`~transformer.decode.static.MAX_COMPILED_ROWS` rows decode eagerly all the same),
        and whether that step has to be built first (tens of seconds to minutes; kept in the
        user's cache)."""
        if not static.should_compile(self.decoding.compile, self.model, group=self.decoding.beam):
            return False, False
        return True, not static.has_package(self.model, self.decoding.beam, logprobs=True)

    def prepare(self) -> None:
        """Load, or build, the compiled step now (see :meth:`compiles`), not in the first batch."""
        static.prepare(self.model, self.decoding.beam, logprobs=True)

    def _decode(self, src: torch.Tensor, n_best: int) -> list[list[Hypothesis]]:
        d = self.decoding
        if d.beam == 1:
            return greedy_search(self.model, src, d.max_len_a, d.max_len_b, compile=d.compile)
        return beam_search(self.model, src, d.beam, d.alpha, n_best, d.max_len_a, d.max_len_b, compile=d.compile,
                           length_norm=d.length_norm)

    def _to_text(self, h: Hypothesis) -> Translation:
        ids = [t for t in h.tokens if t != self.model.cfg.eos_id]
        return Translation(self.subwords.decode(ids), h.score, ids)


def load_translator(models: str | Path | list[str | Path], *, warn: bool = True, **options) -> Translator:
    """A Translator from a run directory (its subword model, or the tokenizer of a run
    imported from Marian, :class:`~transformer.data.marian_tokenizer.MarianSubwords`; its
    preferred weights: averaged, else best, else the latest checkpoint, and the ``decoding`` settings of its
    config.yaml) or from a weights file inside one. ``options`` are fields of
    :class:`DecodingConfig` that override the run's settings (None: keep them). Several
    paths decode as an :class:`~transformer.decode.Ensemble`; they must share one subword
    model (e.g. checkpoints of one run), and the first one's run gives the settings."""
    paths = [Path(models)] if isinstance(models, (str, Path)) else [Path(p) for p in models]
    if not paths:
        raise UserError("no model given")
    decoding = run_decoding(paths[0], {k: v for k, v in options.items() if v is not None})
    loaded, subwords_file = [], None
    for path in paths:
        model, _ = load_model(path, decoding.device)
        found = tokenizer_files(path)
        if subwords_file is None:
            subwords_file = found
        elif found != subwords_file and not _same_files(found, subwords_file):
            raise UserError(f"{found[0]}: not the subword model of {paths[0]} ({subwords_file[0]}); "
                            "the models of an ensemble must come from one run's subword model")
        loaded.append(model)
    subwords_file = subwords_file[0]
    subwords = MarianSubwords.load(subwords_file.parent) if subwords_file.name == SOURCE_SPM \
        else Subwords.load(subwords_file)
    for path, model in zip(paths, loaded):
        # a Marian vocabulary may number fewer pieces than the model has rows (HF then reads
        # a piece from the sentencepiece model), never more
        fits = subwords.vocab_size <= model.cfg.target_vocab_size if isinstance(subwords, MarianSubwords) \
            else subwords.vocab_size == model.cfg.target_vocab_size
        if not fits:
            raise UserError(f"{subwords_file}: {subwords.vocab_size} subwords, but the model in {path} was built for "
                            f"{model.cfg.target_vocab_size}; these files belong to different runs")
    translator = Translator(loaded[0] if len(loaded) == 1 else Ensemble(loaded), subwords, decoding, warn=warn)
    if len(loaded) == 1 and (root := run_root(paths[0])) is not None:
        static.keep_packages_for(translator.model, root)
    return translator


def tokenizer_files(path: str | Path) -> list[Path]:
    """The tokenizer files of the run that ``path`` belongs to: its subwords.model, or for a
    run imported from Marian (:mod:`transformer.interop.marian_run`) its source.spm first and
    the other files of :class:`~transformer.data.marian_tokenizer.MarianSubwords`."""
    source = run_file(path, SOURCE_SPM)
    if source is None:
        return [find_subwords(path)]
    return [source.parent / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB)
            if (source.parent / name).is_file()]


def _same_files(a: list[Path], b: list[Path]) -> bool:
    return [p.name for p in a] == [p.name for p in b] and all(filecmp.cmp(x, y, shallow=False) for x, y in zip(a, b))


def run_decoding(path: str | Path, options: dict | None = None) -> DecodingConfig:
    """The decoding settings for a model path: the defaults, then the ``decoding`` section of
    its run's config.yaml, then ``options`` (field: value; from the command line, named
    ``--field``). Checked before anything big is loaded: a bad value is a one-line error."""
    run = read_run_config(path).get("decoding") or {}
    where = run_file(path, CONFIG)  # a section can only have come from there
    if not isinstance(run, dict):
        raise UserError(f"{where}: decoding must be a mapping of setting: value")
    try:
        base = DecodingConfig.from_dict(run, where=f"{where}: decoding")
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: decoding: {e}") from None
    try:
        return base.replace(**(options or {}))
    except ValueError as e:  # the message starts with the field's name: give it its option's spelling
        name, _, rest = str(e).partition(" ")
        raise UserError(f"--{name.replace('_', '-')} {rest}") from None
