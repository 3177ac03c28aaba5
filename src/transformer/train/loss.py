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
    target = target.reshape(-1)
    keep = target != pad_id
    logits, target = logits.reshape(-1, logits.size(-1))[keep], target[keep]  # padding rows dropped first
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)  # (N',)
    smooth = -lprobs.mean(dim=-1)  # (N',) cross-entropy against the uniform distribution
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.sum(), nll.sum(), keep.sum()


def _upcast(x: Tensor) -> Tensor:
    """bf16 / fp16 -> fp32 for the softmax statistics; fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class _LabelSmoothedCE(torch.autograd.Function):
    """Forward and backward of label-smoothed cross-entropy in a few passes over (N, V).

    With lse = logsumexp(x):  loss = (1 - eps) * (lse - x_y) + eps * (lse - mean(x)),
    and d loss / d x = softmax(x) - (1 - eps) * onehot(y) - eps / V.
    The autograd graph of log_softmax + gather + mean keeps and re-reads several (N, V)
    tensors; this keeps only the logits and writes the gradient once.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float):  # noqa: D102
        x = _upcast(logits)
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        nll = lse - x.gather(1, target[:, None]).squeeze(1)
        smooth = lse - x.mean(dim=-1)
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        loss = (1.0 - epsilon) * nll + epsilon * smooth
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: D102
        logits, target, lse = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.size(-1)
        # d(loss_sum)/dx and d(nll_sum)/dx share softmax(x); combine both upstream grads.
        w_onehot = (1.0 - eps) * grad_loss + grad_nll
        grad = torch.exp(_upcast(logits) - lse[:, None]).mul_(grad_loss + grad_nll)
        grad.sub_(eps * grad_loss / vocab)
        grad.scatter_add_(1, target[:, None], (-w_onehot).expand(target.size(0), 1).to(grad.dtype))
        return grad.to(logits.dtype), None, None


def fused_label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float = 0.1, pad_id: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """The same result as :func:`label_smoothed_nll_loss`, computed with less memory traffic.

    Gradients flow through ``loss_sum`` and ``nll_sum`` (the latter for completeness).
    """
    logits = logits.reshape(-1, logits.size(-1))
    target = target.reshape(-1)
    keep = target != pad_id
    if not bool(keep.all()):
        logits, target = logits[keep], target[keep]
    loss, nll = _LabelSmoothedCE.apply(logits, target, epsilon)
    return loss, nll, keep.sum()
