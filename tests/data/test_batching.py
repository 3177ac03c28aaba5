"""Token batching: budget, coverage, determinism, exact resume, sharding, and the collate."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.data import TokenBatchSampler, collate, example_lengths, filter_long


def _lengths(n=400, seed=0):
    rng = random.Random(seed)
    return [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(n)]


def _cost(batch, lengths):
    """Padded tokens of a batch: n * longest of the larger padded side."""
    return len(batch) * max(max(lengths[i]) for i in batch)


def _epochs(sampler, n):
    return [list(sampler) for _ in range(n)]


def test_budget_respected_and_every_example_once():
    lengths = _lengths()
    batches = list(TokenBatchSampler(lengths, max_tokens=200, seed=3))
    assert all(_cost(b, lengths) <= 200 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))


def test_batches_are_length_bucketed():
    lengths = _lengths()
    ranges = sorted(
        (min(max(lengths[i]) for i in b), max(max(lengths[i]) for i in b))
        for b in TokenBatchSampler(lengths, max_tokens=300, seed=3)
    )
    # Batches hold consecutive lengths: ranges overlap only by the +-1 token of sort noise.
    for (_, prev_hi), (lo, _) in zip(ranges, ranges[1:]):
        assert lo >= prev_hi - 2


def test_over_long_example_gets_its_own_batch():
    lengths = [5, 500, 5, 5, 700]
    batches = list(TokenBatchSampler(lengths, max_tokens=20, seed=0))
    assert [500 in [lengths[i] for i in b] for b in batches].count(True) == 1
    assert [1] in batches and [4] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]


def test_same_seed_same_batches_and_epochs_differ():
    lengths = _lengths()
    a = _epochs(TokenBatchSampler(lengths, 250, seed=7), 3)
    b = _epochs(TokenBatchSampler(lengths, 250, seed=7), 3)
    assert a == b
    assert a[0] != a[1] != a[2]
    assert {tuple(x) for x in a[0]} != {tuple(x) for x in a[1]}  # the batches themselves vary, not only their order
    assert _epochs(TokenBatchSampler(lengths, 250, seed=8), 1)[0] != a[0]


def test_batch_order_is_shuffled_each_epoch():
    lengths = _lengths()
    # Without length noise the batches are the same every epoch; only their order changes.
    first, second = _epochs(TokenBatchSampler(lengths, 250, seed=7, length_noise=0), 2)
    assert sorted(first) == sorted(second) and first != second
    longest = [max(max(lengths[i]) for i in b) for b in first]
    assert longest != sorted(longest)


def test_no_shuffle_is_fixed_and_sorted():
    lengths = _lengths()
    sampler = TokenBatchSampler(lengths, 250, seed=7, shuffle=False)
    first, second = _epochs(sampler, 2)
    assert first == second
    longest = [max(max(lengths[i]) for i in b) for b in first]
    assert longest == sorted(longest)


@pytest.mark.parametrize("stop_at", [0, 1, 13])
def test_resume_mid_epoch_equals_uninterrupted(stop_at):
    lengths = _lengths()
    reference = _epochs(TokenBatchSampler(lengths, 250, seed=11), 3)

    first = TokenBatchSampler(lengths, 250, seed=11)
    list(first)  # epoch 0
    it = iter(first)
    seen = [next(it) for _ in range(stop_at)]
    state = first.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": stop_at, "seed": 11}

    restored = TokenBatchSampler(lengths, 250, seed=999)  # the seed comes from the state
    restored.load_state_dict(state)
    restored.set_epoch(1)  # what a training loop calls; must keep the position
    assert len(restored) == len(reference[1]) - stop_at
    assert seen + list(restored) == reference[1]
    assert list(restored) == reference[2]


def test_state_after_last_batch_points_to_next_epoch():
    sampler = TokenBatchSampler(_lengths(50), 250, seed=1)
    n = len(sampler)
    it = iter(sampler)
    for _ in range(n):
        next(it)
    assert sampler.state_dict() == {"epoch": 1, "batch_in_epoch": 0, "seed": 1}


def test_set_epoch_jumps_to_that_epoch():
    lengths = _lengths()
    reference = _epochs(TokenBatchSampler(lengths, 250, seed=2), 4)
    sampler = TokenBatchSampler(lengths, 250, seed=2)
    sampler.set_epoch(3)
    assert list(sampler) == reference[3]


@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_partition_the_epoch(num_shards):
    lengths = _lengths()
    full = list(TokenBatchSampler(lengths, 250, seed=5))
    shards = [list(TokenBatchSampler(lengths, 250, seed=5, num_shards=num_shards, shard_index=k))
              for k in range(num_shards)]
    usable = len(full) - len(full) % num_shards
    assert {len(s) for s in shards} == {usable // num_shards}
    interleaved = [shards[j % num_shards][j // num_shards] for j in range(usable)]
    assert interleaved == full[:usable]  # disjoint, and only the remainder is dropped


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=120),
    max_tokens=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
)
def test_property_every_index_once_and_within_budget(lengths, max_tokens, seed, epoch):
    sampler = TokenBatchSampler(lengths, max_tokens, seed=seed)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert b and (len(b) == 1 or _cost(b, lengths) <= max_tokens)


def test_filter_long_counts_bos_and_eos():
    examples = [([1] * 9, [1] * 8), ([1] * 10, [1]), ([1], [1] * 9), ([], [])]
    kept, dropped = filter_long(examples, max_len=10)
    assert kept == [examples[0], examples[3]]
    assert dropped == 2
    assert example_lengths(examples) == [(10, 9), (11, 2), (2, 10), (1, 1)]


def test_collate_places_bos_eos_and_padding():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], pad_id=0, bos_id=1, eos_id=2)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.src.tolist() == [[5, 6, 7, 2], [10, 2, 0, 0]]
    assert batch.tgt_in.tolist() == [[1, 8, 9, 0, 0], [1, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, 2, 0, 0], [11, 12, 13, 14, 2]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.n_tgt_tokens == int((batch.tgt_out != 0).sum())
    assert len(batch) == 2 and batch.to("cpu").src.equal(batch.src)


def test_sampler_drives_a_dataloader():
    examples = [([3] * n, [4] * (n % 7 + 1)) for n in range(1, 60)]
    sampler = TokenBatchSampler(example_lengths(examples), max_tokens=64, seed=0)
    loader = torch.utils.data.DataLoader(
        examples, batch_sampler=sampler, collate_fn=lambda ex: collate(ex, pad_id=0, bos_id=1, eos_id=2)
    )
    batches = list(loader)
    assert sum(len(b) for b in batches) == len(examples)
    assert all(b.src.numel() <= 64 and b.tgt_out.numel() <= 64 for b in batches)


def test_lengths_may_change_each_epoch():
    """With a function of the epoch (subword dropout re-segments the text each epoch), each
    epoch is batched by its own lengths, and a restored sampler asks for the same ones."""
    per_epoch = {e: _lengths(seed=100 + e) for e in range(3)}
    asked = []

    def lengths_of(epoch):
        asked.append(epoch)
        return per_epoch[epoch]

    epochs = _epochs(TokenBatchSampler(lengths_of, 250, seed=4), 3)
    for e in range(3):
        assert epochs[e] == list(_at_epoch(per_epoch[e], e))  # as if that epoch's lengths were fixed
        assert all(_cost(b, per_epoch[e]) <= 250 for b in epochs[e])
        assert sorted(i for b in epochs[e] for i in b) == list(range(400))
    assert asked[:3] == [0, 1, 2]

    first = TokenBatchSampler(lengths_of, 250, seed=4)
    list(first)
    it = iter(first)
    seen = [next(it) for _ in range(5)]
    restored = TokenBatchSampler(lengths_of, 250, seed=4)
    restored.load_state_dict(first.state_dict())
    assert seen + list(restored) == epochs[1]


def _at_epoch(lengths, epoch):
    """A fixed-length sampler positioned at ``epoch`` (same seed as the test above)."""
    sampler = TokenBatchSampler(lengths, 250, seed=4)
    sampler.set_epoch(epoch)
    return sampler
