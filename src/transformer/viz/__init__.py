"""Looking inside a trained model: attention heatmaps (PNG and HTML), the heads that link
one word to another, and the forward pass step by step in the article's ten steps
(a language model's prompt: :mod:`.walkthrough_lm`). "The article" is the Chinese
introduction to the Transformer that docs/walkthrough.md follows (it explains the paper,
Vaswani et al. 2017, *Attention Is All You Need*, in ten numbered steps)."""
from .maps import KINDS, AttentionMaps, Pair, collect_attention, prepare_pair, rank_heads
from .walkthrough import Walkthrough, walk

__all__ = ["KINDS", "AttentionMaps", "Pair", "collect_attention", "prepare_pair", "rank_heads", "Walkthrough", "walk"]
