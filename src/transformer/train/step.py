"""One optimizer update over one or more micro-batches (gradient accumulation)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..hardware import native_bf16
from .loss import LossKernels, fused_label_smoothed_nll_loss, smoothed_loss_of_every_row
from .schedule import paper_adam_kwargs


@dataclass(frozen=True)
class StepStats:
    loss: float  # label-smoothed loss per target token
    nll: float  # negative log-likelihood per target token (perplexity = exp(nll))
    n_tokens: int  # non-padding target tokens in the update
    grad_norm: float  # before clipping
    lr: float
    skipped: bool  # True when the loss or a gradient was not finite (no update made)


def paper_adam(params, weight_decay: float = 0.0, betas: tuple[float, float] | None = None) -> torch.optim.Adam:
    """Adam(beta1 0.9, beta2 0.98, eps 1e-9), the fused implementation (one kernel for all
    parameters instead of a loop of small ones)."""
    kwargs = paper_adam_kwargs() if betas is None else {**paper_adam_kwargs(), "betas": tuple(betas)}
    return torch.optim.Adam(params, lr=0.0, weight_decay=weight_decay, fused=True, **kwargs)


def nanogpt_adamw(model: nn.Module, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW as nanoGPT configures it: decoupled weight decay on the 2-D parameters (every
    matrix and the embeddings), none on biases and norm gains; eps 1e-8 (torch's default)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=0.0, betas=tuple(betas), fused=True)


def make_optimizer(model: nn.Module, name: str, weight_decay: float, betas) -> torch.optim.Optimizer:
    """``adam``: :func:`paper_adam` (weight_decay as L2 on every parameter); ``adamw``: :func:`nanogpt_adamw`."""
    if name == "adamw":
        return nanogpt_adamw(model, weight_decay, betas)
    return paper_adam(model.parameters(), weight_decay, betas)


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """auto: bf16 where the hardware has bf16 arithmetic (AVX512-BF16 / AMX CPUs, Ampere+
    GPUs), else fp16 on older GPUs and fp32 on other CPUs."""
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if native_bf16(device) else None


def autocast(device: torch.device, dtype: torch.dtype | None):
    """bf16 / fp16 autocast context, or a no-op for fp32 (dtype None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def forward_loss(forward, inputs: tuple, options: dict, select: Tensor | None, gold: Tensor, epsilon: float,
                 amp_dtype: torch.dtype | None, loss_kernels: LossKernels | None = None) -> tuple[Tensor, Tensor]:
    """The forward pass and Loss = -log p of one micro-batch: (label-smoothed loss sum, nll
    sum) over the ``gold`` (N,) labels of the ``select``-ed positions (None: all of them).
    Under ``torch.compile`` (``compile: true``) it is one graph, the loss included."""
    with autocast(gold.device, amp_dtype):
        logits = forward(*inputs, select, **options)  # (N, V), or (B, T, V) when every position is selected
    logits = logits.reshape(gold.numel(), -1)
    if torch.compiler.is_compiling():
        return smoothed_loss_of_every_row(logits, gold, epsilon)
    loss, nll, _ = fused_label_smoothed_nll_loss(logits, gold, epsilon, -1, loss_kernels)
    return loss, nll


def train_step(
    model: nn.Module,
    micro_batches: list,
    optimizer: torch.optim.Optimizer,
    lr: float,
    *,
    epsilon: float = 0.1,
    clip_norm: float | None = None,
    amp_dtype: torch.dtype | None = None,
    grad_scaler: torch.amp.GradScaler | None = None,
    forward=None,
    loss_kernels: LossKernels | None = None,
    loss_fn=forward_loss,
) -> StepStats:
    """Accumulate gradients over ``micro_batches`` and make one update.

    The loss is normalised by the number of non-padding target tokens in the *whole*
    update, so an update split into micro-batches gives the same gradient as one big batch.

    Args:
        micro_batches: objects with ``inputs`` (the tensors the model reads), ``tgt_out``
            (B, T) labels and an ``n_tgt_tokens`` int (see :class:`transformer.data.Batch`),
            and optionally ``options``, keywords for the model's forward.
        lr: learning rate for this update.
        amp_dtype: torch.bfloat16 / torch.float16 for mixed precision, None for fp32.
        grad_scaler: a GradScaler, for fp16 only.
        forward: the callable that maps (*inputs, select) to the (N, V) logits of the
            selected positions (default: ``model``; pass a DistributedDataParallel wrapper here).
        loss_kernels: compiled loss passes from :func:`~transformer.train.loss.compile_loss`
            (None: the eager loss).
        loss_fn: :func:`forward_loss`, or the same compiled (``compile: true``).

    Under DistributedDataParallel (``forward`` is the wrapper) the token count is summed over
    all ranks before the backward passes and each rank's loss is multiplied by the world
    size, so DDP's gradient *average* equals the gradient of one process that saw every
    rank's micro-batches; gradients are synchronised on the last micro-batch only
    (``no_sync`` before). The returned loss and token count are the global ones, and the
    skip decision is all-reduced, so every rank skips the same updates.
    """
    forward = model if forward is None else forward
    wrapper = getattr(forward, "_orig_mod", forward)  # under torch.compile: the module it compiled
    ddp = isinstance(wrapper, DistributedDataParallel)
    world = torch.distributed.get_world_size(wrapper.process_group) if ddp else 1
    pad_id = model.cfg.pad_id
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = sum(int(b.n_tgt_tokens) for b in micro_batches)
    if world > 1:
        total = int(_all_reduce_sum([total], micro_batches[0].tgt_out.device, wrapper.process_group)[0])
    optimizer.zero_grad(set_to_none=True)
    loss_sum = nll_sum = 0.0
    for i, b in enumerate(micro_batches):
        device = b.tgt_out.device
        # the vocabulary projection runs on scored positions only (a batch may name its own
        # unscored label: a language model's windows, whose pad_id may be a real token)
        select = b.tgt_out != getattr(b, "not_scored", pad_id)
        if bool(select.all()):  # no padding (a language model's windows): no gather, no scatter back
            select = None
        last = i == len(micro_batches) - 1
        with wrapper.no_sync() if ddp and not last else contextlib.nullcontext():
            gold = b.tgt_out.reshape(-1) if select is None else b.tgt_out[select]
            loss, nll = loss_fn(forward, b.inputs, getattr(b, "options", {}), select, gold, epsilon, amp_dtype, loss_kernels)
            scaled = loss * world / max(total, 1)
            (grad_scaler.scale(scaled) if grad_scaler is not None else scaled).backward()
        loss_sum += float(loss.detach())
        nll_sum += float(nll.detach())
    if grad_scaler is not None:
        grad_scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm else math.inf))
    bad = float(not (math.isfinite(grad_norm) and math.isfinite(loss_sum)))
    if world > 1:  # a NaN on any rank skips the update on all of them
        loss_sum, nll_sum, bad = _all_reduce_sum([loss_sum, nll_sum, bad], device, wrapper.process_group)
    skipped = bad > 0 or not math.isfinite(loss_sum)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)  # skips the update itself on inf/nan
        grad_scaler.update()
    elif not skipped:
        optimizer.step()
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    denom = max(total, 1)
    return StepStats(loss_sum / denom, nll_sum / denom, total, grad_norm, lr, skipped)


def finite_in_fp32(model: nn.Module, micro_batches: list) -> bool:
    """Whether the weights give a finite loss and gradient on ``micro_batches`` in fp32
    without dropout (the gradients are set to None again).

    Run after an update was skipped: finite here means the failure lay in the training
    forward (a half-precision overflow, a passing fault) and the weights are fine; not
    finite means the update before broke the weights (an absurd learning rate: weights near
    1e29 may still give a finite loss, but no finite gradient)."""
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    try:
        total = max(sum(int(b.n_tgt_tokens) for b in micro_batches), 1)
        for b in micro_batches:
            select = b.tgt_out != getattr(b, "not_scored", model.cfg.pad_id)
            loss, _ = forward_loss(model, b.inputs, getattr(b, "options", {}), select, b.tgt_out[select], 0.0, None)
            if not math.isfinite(float(loss.detach())):
                return False
            (loss / total).backward()
        params = [p for p in model.parameters() if p.grad is not None]
        return math.isfinite(float(torch.nn.utils.clip_grad_norm_(params, math.inf)))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _all_reduce_sum(values: list[float], device: torch.device, group) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=group)
    return t.tolist()
