"""Baselines to measure the Transformer against (not part of the Transformer itself)."""
from .rnn import RNNSeq2Seq, hidden_size_for

__all__ = ["RNNSeq2Seq", "hidden_size_for"]
