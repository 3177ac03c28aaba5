"""Scoring a model: :mod:`.translation` (BLEU and chrF on a test set, tokenised as the
published results are) and :mod:`.lm` (perplexity of a language model over a text,
with a sliding window)."""
