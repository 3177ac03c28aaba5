"""Decoding strategies. They live outside the model and drive it through its KV cache."""
from .beam import beam_search
from .common import Hypothesis, length_penalty, max_output_lengths, pad_batch
from .ensemble import Ensemble
from .greedy import greedy_search

__all__ = ["beam_search", "greedy_search", "Ensemble", "Hypothesis", "length_penalty", "max_output_lengths", "pad_batch"]
