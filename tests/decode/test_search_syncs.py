"""How often a search waits for the device. On a GPU every read of a device value on the host
(``int()``, ``bool()``, ``.tolist()``: torch's ``_local_scalar_dense``) and every shape that
depends on values (``nonzero``, which a boolean-mask index calls) waits for the queue of kernels
to drain. Counted here on the CPU, where they cost little, by the operators torch dispatches:
a search makes a few per step (what it needs to know: whether rows finished, how many go on),
none per sentence or per hypothesis, and reads its results back at once at the end."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.decode import beam_search, greedy_search
from transformer.decode.scoring import force_eos

SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.item.default}


class CountSyncs(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in SYNCS
        return func(*args, **(kwargs or {}))


def syncs(search, model, src, steps: int) -> int:
    with CountSyncs() as counted:
        hyps = search(model, src, max_len_a=0.0, max_len_b=steps, min_length=steps)
    assert all(len(h[0].tokens) == steps for h in hyps)  # every sentence ran every step
    return counted.count


@pytest.mark.parametrize("search, per_step", [(greedy_search, 2), (lambda *a, **k: beam_search(*a, beam_size=4, **k), 3)],
                         ids=["greedy", "beam4"])
def test_a_search_waits_a_few_times_a_step_whatever_the_batch(make_model, rand_tokens, search, per_step):
    model, steps = make_model(seed=2), 8
    few = syncs(search, model, rand_tokens([5, 3, 4, 2]), steps)
    many = syncs(search, model, rand_tokens([5, 3, 4, 2] * 6), steps)
    assert many == few  # nothing per sentence or per hypothesis
    assert few <= per_step * steps + 6, few


def test_force_eos_leaves_only_eos_where_asked_and_skips_when_none_is():
    lp = torch.randn(3, 7).log_softmax(-1)
    forced = lp.clone()
    force_eos(forced, torch.tensor([True, False, True]), eos_id=2)
    assert torch.equal(forced[1], lp[1]) and torch.equal(forced[[0, 2], 2], lp[[0, 2], 2])
    assert torch.isneginf(forced[[0, 2]][:, [0, 1, 3, 4, 5, 6]]).all()
    untouched = lp.clone()
    force_eos(untouched, torch.zeros(3, dtype=torch.bool), eos_id=2)
    assert torch.equal(untouched, lp)
