"""Resuming on another number of ranks, with the real sampler: the ranks of the old run
consumed the start of the epoch, the ranks of the new run take the rest of it; no batch
is used twice, fewer than new_world are skipped at the seam, and the epoch's tail is cut
as for any sharded epoch (fewer than new_world batches)."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.data import TokenBatchSampler
from transformer.train.distributed import reshard_position


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 120), max_tokens=st.integers(20, 200), old=st.integers(1, 4), new=st.integers(1, 4),
       frac=st.floats(0, 1), seed=st.integers(0, 1000))
def test_resharded_epoch_never_repeats_a_batch(n, max_tokens, old, new, frac, seed):
    rng = random.Random(seed)
    lengths = [(rng.randint(1, 30), rng.randint(1, 30)) for _ in range(n)]
    full = [tuple(b) for b in TokenBatchSampler(lengths, max_tokens, seed)]
    olds = [TokenBatchSampler(lengths, max_tokens, seed, num_shards=old, shard_index=k) for k in range(old)]
    shard_len = len(olds[0])
    per_rank = int(frac * shard_len)  # batches each old rank trained on before the checkpoint
    done = []
    for s in olds:
        it = iter(s)
        done.append([tuple(next(it)) for _ in range(per_rank)])
    state = olds[0].state_dict()
    assert all(s.state_dict() == state for s in olds)  # every rank saves the same position
    consumed = [b for i in range(per_rank) for b in (d[i] for d in done)]
    assert consumed == full[: per_rank * old]  # the old ranks took the epoch's first batches

    moved, skipped = reshard_position(state, old, new)
    if state["epoch"] == 1:  # the old ranks finished the epoch: the new ones start the next
        assert per_rank == shard_len and moved == state == {"epoch": 1, "batch_in_epoch": 0, "seed": seed}
        return
    rest = []
    for k in range(new):
        s = TokenBatchSampler(lengths, max_tokens, seed, num_shards=new, shard_index=k)
        s.load_state_dict(moved)
        rest.append([tuple(b) for b in s] if s.state_dict()["epoch"] == 0 else [])
    rest_flat = [b for i in range(max(map(len, rest), default=0)) for r in rest if i < len(r) for b in [r[i]]]
    assert len(set(consumed) | set(rest_flat)) == len(consumed) + len(rest_flat)  # nothing twice
    assert 0 <= skipped < new
    if rest_flat:
        start = full.index(rest_flat[0])
        assert start == len(consumed) + skipped
        assert rest_flat == full[start: start + len(rest_flat)]
        assert len(full) - (start + len(rest_flat)) < new  # only the sharding cut at the end
