"""BPE-dropout (Provilkov et al., 2020): a new segmentation of the training text every epoch.

BPE builds a word from its characters by applying merges in a fixed order of priority.
BPE-dropout skips each possible merge with probability ``p`` at every step (and stops when
every remaining merge was skipped), so the same word comes out in different, smaller pieces
from epoch to epoch: the model sees how words are made of their parts and over-fits less
to one segmentation. Translation keeps the ordinary, deterministic segmentation.

How it is done here, and why not with sentencepiece's own sampler: sentencepiece 0.2's
sampling is repeatable within a process after ``set_random_generator_seed`` but differs
between processes, and a resumed run or the ranks of a data-parallel run are other
processes. So the merges run in Python from the vocabulary's priorities (a sentencepiece
BPE piece's score is minus its merge rank), on :class:`random.Random` generators seeded
from the run's seed:

1. Each sentence is split into words at the pieces that begin with "▁" (the vocabulary never
   merges across a word start), using sentencepiece's deterministic segmentation.
2. For every distinct word, ``variants`` segmentations are drawn with BPE-dropout, once
   (seeded by the seed alone). With ``p = 0`` the same code reproduces sentencepiece's
   segmentation exactly (tested on Multi30k); a word it would not reproduce, or one holding
   an unknown character, keeps its deterministic pieces only.
3. Each epoch picks, for every word occurrence, one of its word's variants (seeded by
   ``(seed, epoch)``) and joins them into sentences.

The result depends only on ``(sentences, subwords, p, seed, epoch)``, in any process.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import chain

import numpy as np

from .subwords import Subwords

__all__ = ["SubwordDropout", "bpe_merge"]

WORD_START = "\u2581"  # "▁"


def bpe_merge(word: str, scores: dict[str, float], dropout: float = 0.0,
              rng: random.Random | None = None) -> list[str] | None:
    """Segment ``word`` by BPE merges, each skipped with probability ``dropout`` per step.

    Starts from the characters and repeatedly merges the adjacent pair whose concatenation
    is the highest-scoring piece (the leftmost on a tie). Returns ``None`` when a character
    is not a piece (it would be unknown).
    """
    symbols = list(word)
    if any(c not in scores for c in symbols):
        return None
    get = scores.get
    pairs = [get(a + b) for a, b in zip(symbols, symbols[1:])]  # score of merging i and i + 1
    while pairs:
        best, best_score = -1, -float("inf")
        for i, score in enumerate(pairs):
            # A merge that cannot beat the best one kept so far needs no draw: whether it is
            # skipped does not change the step.
            if score is None or score <= best_score:
                continue
            if dropout and rng.random() < dropout:  # this merge is skipped at this step
                continue
            best, best_score = i, score
        if best < 0:
            break
        symbols[best: best + 2] = [symbols[best] + symbols[best + 1]]
        del pairs[best]
        if best > 0:
            pairs[best - 1] = get(symbols[best - 1] + symbols[best])
        if best < len(pairs):
            pairs[best] = get(symbols[best] + symbols[best + 1])
    return symbols


class SubwordDropout:
    """Per-epoch BPE-dropout segmentations of the training sentences (see the module's docstring).

    Args:
        subwords: the run's sentencepiece BPE model.
        encoded: the training sentences in their usual pieces (``subwords.encode``).
        dropout: the probability ``p`` of skipping a merge, in (0, 1).
        seed: with the epoch, fixes every draw.
        variants: segmentations drawn per distinct word.
    """

    def __init__(self, subwords: Subwords, encoded: Sequence[Sequence[int]], dropout: float, seed: int,
                 variants: int = 16):
        if not 0.0 < dropout < 1.0:
            raise ValueError(f"dropout must be in (0, 1), got {dropout}")
        self.seed, self.variants = seed, variants
        vocab = subwords.vocab()
        scores = {p: subwords.score(i) for i, p in enumerate(vocab) if subwords.is_normal(i)}
        piece_id = {p: i for i, p in enumerate(vocab) if subwords.is_normal(i)}
        word_ids: dict[str, int] = {}
        fixed: list[tuple[int, ...]] = []  # the deterministic ids of each distinct word
        sentences: list[list[int]] = []  # word ids of each sentence
        for ids in encoded:
            words, start = [], 0
            for k in range(1, len(ids) + 1):
                if k == len(ids) or vocab[ids[k]].startswith(WORD_START):
                    piece_ids = tuple(ids[start:k])
                    key = "".join(vocab[i] for i in piece_ids)
                    if subwords.unk_id in piece_ids:
                        key = f"{key}\0{piece_ids}"  # the surface is lost: never re-segmented
                    if key not in word_ids:
                        word_ids[key] = len(fixed)
                        fixed.append(piece_ids)
                    words.append(word_ids[key])
                    start = k
            sentences.append(words)
        rng = random.Random(seed)
        table: list[tuple[int, ...]] = []  # row w * variants + k: variant k of distinct word w
        self.n_kept_fixed = 0  # distinct words left with their deterministic pieces only
        for key, ids in zip(word_ids, fixed):
            pieces = None if subwords.unk_id in ids else bpe_merge(key, scores)
            if pieces is None or tuple(piece_id[p] for p in pieces) != ids:
                self.n_kept_fixed += 1
                table.extend([ids] * variants)
                continue
            for _ in range(variants):
                table.append(tuple(piece_id[p] for p in bpe_merge(key, scores, dropout, rng)))
        self._row_len = np.array([len(r) for r in table], dtype=np.int64)
        self._row_start = np.cumsum(self._row_len) - self._row_len
        self._flat = np.fromiter(chain.from_iterable(table), dtype=np.int64, count=int(self._row_len.sum()))
        self._words = np.fromiter(chain.from_iterable(sentences), dtype=np.int64)
        self._n_words_per_sentence = np.array([len(s) for s in sentences], dtype=np.int64)
        self.n_words = len(fixed)

    def epoch(self, epoch: int) -> list[list[int]]:
        """The ids of every sentence for ``epoch``: one drawn variant per word occurrence."""
        rng = np.random.default_rng([self.seed, epoch])
        rows = self._words * self.variants + rng.integers(0, self.variants, len(self._words))
        lens = self._row_len[rows]
        # A ragged gather: the ids of row rows[j] land at out_start[j] .. out_start[j] + lens[j].
        out_start = np.cumsum(lens) - lens
        idx = np.arange(int(lens.sum())) + np.repeat(self._row_start[rows] - out_start, lens)
        ids = self._flat[idx]
        words_end = np.cumsum(self._n_words_per_sentence)
        ids_end = np.cumsum(lens)[words_end - 1] if len(lens) else words_end
        ids_end = np.where(self._n_words_per_sentence > 0, ids_end, 0)
        ids_end = np.maximum.accumulate(ids_end)  # a sentence without words ends where the last one did
        return [part.tolist() for part in np.split(ids, ids_end[:-1])]
