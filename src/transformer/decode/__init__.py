"""Decoding strategies. They live outside the model and drive it through its KV cache, one step
at a time (decode/eager_step.py: the step a search is handed; by default the model's own
``decode``): greedy and beam search for translation, sampling for the language model.

The names below are imported on first use (PEP 562), so ``from transformer.decode.decoding_config
import DecodingConfig`` loads no search and no model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# public name -> the module that defines it
_LAZY = {
    "beam_search": ".beam",
    **dict.fromkeys(("Hypothesis", "length_batches", "length_penalty", "max_output_lengths", "pad_batch"), ".scoring"),
    "Ensemble": ".ensemble",
    "greedy_search": ".greedy",
    **dict.fromkeys(("filter_logits", "generate", "generate_stream"), ".sample"),
}
__all__ = list(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from .beam import beam_search
    from .scoring import Hypothesis, length_batches, length_penalty, max_output_lengths, pad_batch
    from .ensemble import Ensemble
    from .greedy import greedy_search
    from .sample import filter_logits, generate, generate_stream


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
