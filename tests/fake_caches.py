"""A small KVCache whose every entry says where it came from (row, layer), for the tests of the
cache itself (tests/model/test_cache.py) and of the rows a search keeps (tests/decode/test_rows.py).
Importable from every test folder."""
from __future__ import annotations

import torch

from transformer import KVCache


def fake_cache(batch=3, layers=2, t=4):
    """``batch`` rows, ``layers`` layers, ``t`` self-attention positions and 6 source positions;
    a K entry is its row's index plus 10 x layer (cross) or 100 x layer (self), V its negative;
    row 0's source is all padding."""
    def kv(tag, length):
        k = torch.arange(batch, dtype=torch.float32)[:, None, None, None].expand(batch, 2, length, 5) + tag
        return k.clone(), -k.clone()

    return KVCache(
        cross_kv=tuple(kv(10 * i, 6) for i in range(layers)),
        self_kv=tuple(kv(100 * i, t) for i in range(layers)),
        memory_mask=torch.arange(batch)[:, None, None, None].expand(batch, 1, 1, 6) > 0,
    )
