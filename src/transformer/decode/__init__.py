"""Decoding strategies. They live outside the model and drive it through its KV cache:
greedy and beam search for translation, sampling for the language model."""
from .beam import beam_search
from .common import Hypothesis, length_penalty, max_output_lengths, pad_batch
from .ensemble import Ensemble
from .greedy import greedy_search
from .sample import filter_logits, generate, generate_stream

__all__ = ["beam_search", "greedy_search", "generate", "generate_stream", "filter_logits", "Ensemble", "Hypothesis", "length_penalty", "max_output_lengths", "pad_batch"]
