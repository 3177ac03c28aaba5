"""Label-smoothed cross-entropy, as a small pure function."""
from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy against a smoothed target distribution (section 5.4 of the paper).

    The target distribution puts 1 - epsilon on the true token and spreads epsilon
    uniformly over the vocabulary (the true token included), so
        loss_i = (1 - eps) * nll_i + eps * mean_v(-log p_i(v)).
    Padding positions contribute to neither term.

    Args:
        logits: (B, T, V) or (N, V) unnormalised scores.
        target: (B, T) or (N,) gold ids, ``pad_id`` where there is no token.

    Returns:
        (loss_sum, nll_sum, n_tokens): sums over non-padding tokens and their count.
        Divide by ``n_tokens`` (summed over accumulated micro-batches) for the mean.
    """
    lprobs = torch.log_softmax(logits.float(), dim=-1).reshape(-1, logits.size(-1))  # (N, V)
    target = target.reshape(-1)
    keep = target != pad_id
    lprobs, target = lprobs[keep], target[keep]
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)  # (N',)
    smooth = -lprobs.mean(dim=-1)  # (N',) cross-entropy against the uniform distribution
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum(), keep.sum()
