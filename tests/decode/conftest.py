"""A tiny real model whose EOS logit is biased so that hypotheses end at varied lengths."""
from __future__ import annotations

import pytest
import torch

EOS_BIAS = -0.5  # with seed 2: greedy runs to the length limit, beam hypotheses end after 1..8 tokens


@pytest.fixture
def decoder_model(make_model):
    model = make_model(seed=2, output_bias=True)
    with torch.no_grad():
        model.out_bias[model.cfg.eos_id] = EOS_BIAS
    return model


@pytest.fixture
def ragged_src(rand_tokens):
    """Five sentences of different real lengths, right-padded to 9."""
    return rand_tokens([7, 2, 5, 1, 4], width=9)
