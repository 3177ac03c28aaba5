"""Token-count batching with length bucketing, exact resume and sharding; padding collate.

An *example* is ``(src_ids, tgt_ids)``: subword ids without BOS/EOS. In a batch the source
gets EOS appended and the target becomes ``tgt_in = [BOS] + tgt`` and ``tgt_out = tgt + [EOS]``,
so an example occupies ``len(src) + 1`` source and ``len(tgt) + 1`` target positions
(:func:`example_lengths`).

Typical use with a ``DataLoader`` (the sampler yields lists of example indices)::

    sampler = TokenBatchSampler(example_lengths(examples), max_tokens=4096, seed=1)
    loader = DataLoader(examples, batch_sampler=sampler,
                        collate_fn=functools.partial(collate, pad_id=0, bos_id=1, eos_id=2))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["Example", "Batch", "filter_long", "fits", "example_lengths", "TokenBatchSampler", "collate",
           "label_positions"]

Example = tuple[Sequence[int], Sequence[int]]


def filter_long(examples: Sequence[Example], max_len: int) -> tuple[list[Example], int]:
    """Drop examples that do not fit ``max_len`` positions.

    An example is too long when ``len(src) + 1`` (EOS) or ``len(tgt) + 2`` (BOS and EOS)
    exceeds ``max_len``.

    Returns:
        ``(kept, n_dropped)``.
    """
    kept = [ex for ex, k in zip(examples, fits(examples, max_len)) if k]
    return kept, len(examples) - len(kept)


def fits(examples: Sequence[Example], max_len: int) -> list[bool]:
    """Whether each example fits ``max_len`` positions (see :func:`filter_long`)."""
    return [len(src) + 1 <= max_len and len(tgt) + 2 <= max_len for src, tgt in examples]


def example_lengths(examples: Sequence[Example]) -> list[tuple[int, int]]:
    """Padded-tensor lengths ``(len(src) + 1, len(tgt) + 1)`` of each example, for the sampler."""
    return [(len(src) + 1, len(tgt) + 1) for src, tgt in examples]


class TokenBatchSampler(Sampler[list[int]]):
    """Groups example indices into batches of at most ``max_tokens`` padded tokens.

    A batch costs ``n_sentences * max(longest source, longest target)``, i.e. the larger of
    its two padded tensors. Examples are sorted by length (plus a little seeded noise, so
    batches differ between epochs) and cut greedily into batches; the order of batches is
    then shuffled. Both depend only on ``(seed, epoch)``. An example longer than
    ``max_tokens`` gets a batch to itself: nothing is dropped.

    Iterating yields the rest of the current epoch, then moves to the next epoch, so
    ``for epoch ...: for batch in sampler`` walks the epochs in order. :meth:`state_dict` /
    :meth:`load_state_dict` record the position (``batch_in_epoch`` counts batches already
    yielded), so a restored sampler yields exactly what an uninterrupted one would have.
    With a prefetching ``DataLoader`` (``num_workers > 0``) the sampler runs ahead of
    training; then save the number of batches *trained on* as ``batch_in_epoch`` instead.

    Sharding (for DistributedDataParallel): every shard builds the same batch list for the
    epoch, drops the last ``len % num_shards`` batches so that all shards run the same
    number of steps, and shard ``k`` takes batches ``k, k + N, k + 2N, ...``. With shuffling
    the dropped batches change every epoch, so no example is lost for good.

    Args:
        lengths: per example either one length or ``(src_len, tgt_len)`` in padded positions
            (see :func:`example_lengths`); or a function ``epoch -> lengths`` when the
            examples change from epoch to epoch (subword dropout re-segments them), the
            same number of examples each epoch.
        max_tokens: token budget of one batch (> 0).
        seed: non-negative seed; with the epoch it fixes noise and batch order.
        shuffle: add length noise and shuffle batch order; if false the batches are the
            same each epoch, in order of increasing length (for evaluation).
        num_shards, shard_index: this process's share of each epoch's batches.
        length_noise: noise added to each length before sorting, uniform in
            ``[-length_noise, +length_noise]`` tokens (only when shuffling).
    """

    def __init__(
        self,
        lengths: Sequence[int] | Sequence[tuple[int, int]] | Callable[[int], Sequence[tuple[int, int]]],
        max_tokens: int,
        seed: int,
        shuffle: bool = True,
        num_shards: int = 1,
        shard_index: int = 0,
        length_noise: float = 1.0,
    ):
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if num_shards < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(f"need num_shards >= 1 and 0 <= shard_index < num_shards, got {shard_index}/{num_shards}")
        self._lengths_of = lengths if callable(lengths) else None
        if self._lengths_of is None:
            self._set_lengths(lengths)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.num_shards = num_shards
        self.shard_index = shard_index
        self.length_noise = length_noise
        self.epoch = 0
        self.batch_in_epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def _set_lengths(self, lengths) -> None:
        pairs = np.array([(x, x) if np.isscalar(x) else tuple(x) for x in lengths], dtype=np.int64).reshape(-1, 2)
        if (pairs < 0).any():
            raise ValueError("lengths must be non-negative")
        self.src_lengths, self.tgt_lengths = pairs[:, 0], pairs[:, 1]
        self.sizes = pairs.max(axis=1)  # a batch's cost is n * max(size)

    # -- building one epoch ---------------------------------------------------------------

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """This shard's batches for ``epoch`` (cached for the latest epoch asked)."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._build(epoch))
        return self._cache[1]

    def _build(self, epoch: int) -> list[list[int]]:
        if self._lengths_of is not None:
            self._set_lengths(self._lengths_of(epoch))
        rng = np.random.default_rng([self.seed, epoch])
        noise = np.zeros(len(self.sizes))
        if self.shuffle and self.length_noise > 0:
            noise = rng.uniform(-self.length_noise, self.length_noise, len(self.sizes))
        # np.lexsort sorts by the last key first: noisy size, then source, then target length.
        order = np.lexsort((self.tgt_lengths, self.src_lengths, self.sizes + noise))
        batches, batch, longest = [], [], 0
        for i in order.tolist():
            size = int(self.sizes[i])
            if batch and (len(batch) + 1) * max(longest, size) > self.max_tokens:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, size)
        if batch:
            batches.append(batch)
        if self.shuffle:
            batches = [batches[j] for j in rng.permutation(len(batches)).tolist()]
        usable = len(batches) - len(batches) % self.num_shards
        return batches[self.shard_index : usable : self.num_shards]

    # -- iteration and state --------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches(self.epoch)
        while self.batch_in_epoch < len(batches):
            # Count the batch before handing it out, so a state saved after training on it
            # resumes with the next one.
            self.batch_in_epoch += 1
            yield batches[self.batch_in_epoch - 1]
        self.epoch += 1
        self.batch_in_epoch = 0

    def __len__(self) -> int:
        """Batches left in the current epoch (all of them at its start)."""
        return len(self._epoch_batches(self.epoch)) - self.batch_in_epoch

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of ``epoch``; a no-op if already in it, so calling it after
        :meth:`load_state_dict` keeps the restored position."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.batch_in_epoch = 0

    def state_dict(self) -> dict[str, int]:
        """``{'epoch', 'batch_in_epoch', 'seed'}``; a finished epoch reads as the next one's start."""
        epoch, done = self.epoch, self.batch_in_epoch
        if done >= len(self._epoch_batches(epoch)):
            epoch, done = epoch + 1, 0
        return {"epoch": epoch, "batch_in_epoch": done, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position saved by :meth:`state_dict` (the seed included)."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        self._cache = None


class Movable:
    """How both kinds of batch (:class:`Batch`, :class:`~transformer.data.text.TextBatch`)
    move: a copy made by ``_map``, which applies a function to each of its tensors."""

    def _map(self, move: Callable[[torch.Tensor], torch.Tensor]):
        raise NotImplementedError

    def to(self, device: torch.device | str, non_blocking: bool = False):
        """A copy with the tensors on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self):
        """A copy in pinned memory, from which a copy to a GPU need not wait (``non_blocking``)."""
        return self._map(torch.Tensor.pin_memory)


@dataclass
class Batch(Movable):
    """Padded tensors of one batch, batch-first, right-padded with ``pad_id``.

    Attributes:
        src: ``(B, S)`` source ids followed by EOS.
        tgt_in: ``(B, T)`` decoder input, BOS followed by the target ids.
        tgt_out: ``(B, T)`` labels, the target ids followed by EOS.
        n_src_tokens: non-pad positions in ``src``.
        n_tgt_tokens: non-pad positions in ``tgt_out`` (normalises the loss).
        scored: the (N,) indices of the non-pad positions of the flattened ``tgt_out``, or
            None when there is no padding (see :func:`label_positions`).
        src_padded: whether any source holds padding.

    The last three are counted on the host where the batch is made, so that a GPU never
    stops to count them.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int
    n_tgt_tokens: int
    scored: torch.Tensor | None
    src_padded: bool

    def __len__(self) -> int:
        return self.src.shape[0]

    @property
    def inputs(self) -> tuple[torch.Tensor, ...]:
        """What the model reads before the labels: ``model(*batch.inputs)`` gives logits for
        ``tgt_out``. The training step knows batches only through ``inputs``, ``tgt_out`` and
        ``n_tgt_tokens`` (and ``options``, ``scored``), so a batch of another task (one token
        stream) plugs in unchanged."""
        return self.src, self.tgt_in

    @property
    def options(self) -> dict:
        """Keywords for the model's forward: whether a source holds padding (counted here, not
        looked up on the device)."""
        return {"src_padded": self.src_padded}

    def _map(self, move: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        scored = None if self.scored is None else move(self.scored)
        return Batch(move(self.src), move(self.tgt_in), move(self.tgt_out), self.n_src_tokens, self.n_tgt_tokens,
                     scored, self.src_padded)


def label_positions(labels: torch.Tensor, missing: int) -> tuple[int, torch.Tensor | None]:
    """How many positions of ``labels`` (B, T) hold a label (are not ``missing``), and their
    (N,) indices in ``labels.flatten()``, or None when every position does. Made on the host,
    beside the batch (a GPU would have to stop and count them)."""
    keep = labels.reshape(-1) != missing
    n = int(keep.sum())
    return n, (None if n == keep.numel() else keep.nonzero().squeeze(1))


def collate(examples: Sequence[Example], pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """Pad a list of examples into a :class:`Batch`, adding EOS to sources and BOS/EOS to targets."""
    if len(examples) == 0:
        raise ValueError("cannot collate an empty list of examples")
    srcs = [list(src) + [eos_id] for src, _ in examples]
    tgt_ins = [[bos_id] + list(tgt) for _, tgt in examples]
    tgt_outs = [list(tgt) + [eos_id] for _, tgt in examples]
    tgt_out = _pad(tgt_outs, pad_id)
    n_tgt, scored = label_positions(tgt_out, pad_id)
    return Batch(
        src=_pad(srcs, pad_id),
        tgt_in=_pad(tgt_ins, pad_id),
        tgt_out=tgt_out,
        n_src_tokens=sum(map(len, srcs)),
        n_tgt_tokens=n_tgt,
        scored=scored,
        src_padded=len(set(map(len, srcs))) > 1,
    )


def _pad(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad rows into a ``(len(rows), longest)`` LongTensor."""
    out = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out
