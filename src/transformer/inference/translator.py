"""Text in, text out: subwords, batching by length, decoding, order restored."""
from __future__ import annotations

import filecmp
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data import Subwords
from ..data.marian_tokenizer import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB, MarianSubwords
from ..decode import Ensemble, Hypothesis, beam_search, greedy_search, length_batches, pad_batch
from ..decode.decoding_config import DecodingConfig
from ..decode.shortlist import Shortlist, search_shortlisted
from ..errors import UserError
from .front_door import GPU_MAX_TOKENS, FrontDoor, given, open_model, run_decoding, vocabulary_fits
from .run_shortlist import run_shortlist
from ..model import Transformer
from ..run import SUBWORDS, find_subwords, run_file

__all__ = ["Translation", "Translator", "load_translator", "run_decoding", "tokenizer_files"]


@dataclass(frozen=True)
class Translation:
    text: str
    score: float  # length-normalised log-probability
    tokens: list[int]


class Translator(FrontDoor):
    """Translate lines with a trained model and the subword model it was trained with.

    Lines are encoded exactly as in training, sorted by length into batches of at most
    ``decoding.max_tokens`` source tokens, decoded (``decoding.beam`` 1: greedy search,
    else beam search), and returned in input order. ``model`` may be an
    :class:`~transformer.decode.Ensemble` of models that share ``subwords``.
    ``decoding.precision`` (fp32, bf16 or int8; see :mod:`transformer.decode.precision`)
    decodes with a converted copy of the model; the model passed in is left as it was. An
    empty (or whitespace-only) line gives an empty translation. A line longer than the model
    can take is cut to its first ``max_len - 1`` subwords with a warning (``warn=False``:
    only counted in ``truncated``). ``decoding.shortlist`` projects each batch onto its
    vocabulary shortlist only (``shortlist``, :mod:`transformer.decode.shortlist`;
    :meth:`from_pretrained` reads the run's, or builds it from the run's training corpus).

        translator = Translator.from_pretrained("runs/demo")   # the run's own decoding settings
        translator.translate(["A dog runs."])
    """

    gpu_max_tokens = GPU_MAX_TOKENS
    too_long = ("a line of {n} subwords is longer than the model's limit ({room}); "
                "translating its first {room} subwords only")
    keep_last = False

    def __init__(self, model: Transformer | Ensemble, subwords: Subwords | MarianSubwords,
                 decoding: DecodingConfig | None = None, *, warn: bool = True,
                 shortlist: Shortlist | None = None) -> None:
        super().__init__(model, decoding, warn)
        self.subwords = subwords
        self.shortlist = shortlist  # read when decoding.shortlist is on (decode/shortlist.py)
        self._check_shortlist()

    def with_decoding(self, **changes) -> "Translator":
        other = super().with_decoding(**changes)
        other._check_shortlist()
        return other

    @classmethod
    def from_pretrained(cls, path: str | Path | list[str | Path], *, warn: bool = True, **options) -> "Translator":
        """A translator for a run directory (or a weights file in one; several: an
        ensemble), decoding as the run's recipe does unless ``options`` (fields of
        :class:`DecodingConfig`, e.g. ``beam=1``) say otherwise."""
        return load_translator(path, warn=warn, **options)

    def encode(self, line: str) -> list[int]:
        return self.fit_length(self.subwords.encode(line)) + [self.model.cfg.eos_id]

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
        for batch in length_batches([len(ids) for _, ids in todo], self.decoding.max_tokens):
            chunk = [todo[j] for j in batch]
            src = pad_batch([ids for _, ids in chunk], self.model.cfg.pad_id, self.device)
            for (i, _), hyps in zip(chunk, self._decode(src, n_best)):
                results[i] = [self._to_text(h) for h in hyps]
            if progress is not None:
                progress(len(chunk))
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
        chunk_lines = min(chunk_lines, sys.maxsize)  # islice's limit; more is the whole input at once all the same
        while chunk := list(itertools.islice(it, chunk_lines)):
            yield self.translate_nbest(chunk, n_best, progress)

    def search_kind(self) -> tuple[int, bool, int]:
        return self.decoding.beam, True, 0  # a row per beam, log-probabilities

    def compiles(self, rows: int | None = None) -> tuple[bool, bool]:
        """As :meth:`FrontDoor.compiles`; never with the shortlist on (the compiled step
        projects onto the whole vocabulary; the shortlisted one is eager)."""
        return (False, False) if self.decoding.shortlist else super().compiles(rows)

    def _check_shortlist(self) -> None:
        if not self.decoding.shortlist:
            return
        if isinstance(self.model, Ensemble):
            raise UserError("--shortlist decodes one model, not an ensemble; give one --model, or drop --shortlist")
        if self.shortlist is None:
            raise UserError("--shortlist needs the run's vocabulary shortlist: load the model with "
                            "Translator.from_pretrained (or give shortlist=), or drop --shortlist")

    def _decode(self, src: torch.Tensor, n_best: int) -> list[list[Hypothesis]]:
        d = self.decoding
        if d.shortlist:
            return search_shortlisted(self.model, src, self.shortlist, d.beam, d.alpha, n_best, d.max_len_a,
                                      d.max_len_b, d.length_norm)
        step = self.search_step(src.size(0) * d.beam)
        if d.beam == 1:
            return greedy_search(self.model, src, d.max_len_a, d.max_len_b, step=step)
        return beam_search(self.model, src, d.beam, d.alpha, n_best, d.max_len_a, d.max_len_b, step=step,
                           length_norm=d.length_norm)

    def _to_text(self, h: Hypothesis) -> Translation:
        ids = [t for t in h.tokens if t != self.model.cfg.eos_id]
        return Translation(self.subwords.decode(ids), h.score, ids)


def load_translator(models: str | Path | list[str | Path], *, warn: bool = True,
                    shortlist_pairs: list[tuple[str, str]] | None = None, **options) -> Translator:
    """A Translator from a run directory (its subword model, or the tokenizer of a run
    imported from Marian, :class:`~transformer.data.marian_tokenizer.MarianSubwords`; its
    preferred weights: averaged, else best, else the latest checkpoint, and the ``decoding`` settings of its
    config.yaml) or from a weights file inside one. ``options`` are fields of
    :class:`DecodingConfig` that override the run's settings (None: keep them). Several
    paths decode as an :class:`~transformer.decode.Ensemble`; they must share one subword
    model (e.g. checkpoints of one run), and the first one's run gives the settings.
    ``shortlist_pairs`` (source, target sentences): build the run's vocabulary shortlist from
    them, replacing any it has, and decode with it (an imported model has no training corpus
    to build it from)."""
    paths = [Path(models)] if isinstance(models, (str, Path)) else [Path(p) for p in models]
    if not paths:
        raise UserError("no model given")
    decoding = run_decoding(paths[0], given(options))
    loaded, subwords_file = [], None
    for path in paths:
        model = open_model(path, decoding, language_model=False)
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
        if not vocabulary_fits(subwords.vocab_size, model.cfg.target_vocab_size,
                               imported=isinstance(subwords, MarianSubwords)):
            raise UserError(f"{subwords_file}: {subwords.vocab_size} subwords, but the model in {path} was built for "
                            f"{model.cfg.target_vocab_size}; these files belong to different runs")
    shortlist = None
    if shortlist_pairs is not None:
        decoding = decoding.replace(shortlist=True)
    if decoding.shortlist and len(loaded) == 1:  # (an ensemble is refused by the Translator)
        shortlist = run_shortlist(paths[0], subwords, loaded[0].cfg, pairs=shortlist_pairs)
    translator = Translator(loaded[0] if len(loaded) == 1 else Ensemble(loaded), subwords, decoding, warn=warn,
                            shortlist=shortlist)
    if len(loaded) == 1:
        translator.keep_compiled_steps(paths[0])
    return translator


def tokenizer_files(path: str | Path) -> list[Path]:
    """The tokenizer files of the run that ``path`` belongs to: its subwords.model, or for a
    run imported from Marian (:mod:`transformer.interop.marian_run`) its source.spm first and
    the other files of :class:`~transformer.data.marian_tokenizer.MarianSubwords`."""
    source = run_file(path, SOURCE_SPM, SUBWORDS)  # the nearest folder's: a run's own, not one above it
    if source is None or source.name == SUBWORDS:
        return [find_subwords(path)]
    return [source.parent / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB)
            if (source.parent / name).is_file()]


def _same_files(a: list[Path], b: list[Path]) -> bool:
    return [p.name for p in a] == [p.name for p in b] and all(filecmp.cmp(x, y, shallow=False) for x, y in zip(a, b))
