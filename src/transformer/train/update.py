"""One optimizer update over one or more micro-batches (gradient accumulation)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..hardware import native_bf16
from ..model.transformer import at_positions
from .loss import LossKernels, fused_loss_of_every_row, smoothed_loss_of_every_row
from .schedule import paper_adam_kwargs


@dataclass(frozen=True)
class StepStats:
    """One update's figures. As :func:`train_step` returns them, ``loss``, ``nll``, ``grad_norm``
    and ``skipped`` are 0-d tensors on the update's device (and ``n_tokens`` too under DDP):
    reading one back to the host waits for the update to finish, which on a GPU stalls the
    queue of kernels, so the training loop reads them every ``log_every`` updates, many
    updates' at once (:func:`read_back`). :meth:`read` gives one update's as Python numbers."""

    loss: Tensor | float  # label-smoothed loss per target token
    nll: Tensor | float  # negative log-likelihood per target token (perplexity = exp(nll))
    n_tokens: Tensor | int  # non-padding target tokens in the update
    grad_norm: Tensor | float  # before clipping
    lr: float
    skipped: Tensor | bool  # True when the loss or a gradient was not finite (no update made)

    def read(self) -> StepStats:
        """The same figures as Python numbers (one read from the device)."""
        return read_back([self])[0]


def read_back(stats: list[StepStats]) -> list[StepStats]:
    """The figures of several updates as Python numbers, read from the device at once (one
    synchronisation for all of them)."""
    if not stats:
        return []

    def row(s: StepStats) -> Tensor:
        values = [s.loss, s.nll, s.grad_norm, s.skipped] + ([s.n_tokens] if isinstance(s.n_tokens, Tensor) else [])
        return torch.stack([torch.as_tensor(v).to(torch.float64).reshape(()) for v in values])

    rows = torch.cat([row(s) for s in stats]).tolist()  # one read
    out, i = [], 0
    for s in stats:
        loss, nll, norm, bad = rows[i: i + 4]
        i += 4
        n = s.n_tokens
        if isinstance(n, Tensor):
            n, i = int(rows[i]), i + 1
        out.append(StepStats(loss, nll, n, norm, s.lr, bool(bad)))
    return out


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
    return fused_loss_of_every_row(logits, gold, epsilon, loss_kernels)


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
    """Accumulate gradients over ``micro_batches`` and make one update, without reading
    anything back from the device: the figures it returns stay there (:class:`StepStats`),
    and an update whose loss or gradient is not finite is skipped on the device
    (:func:`step_unless`).

    The loss is normalised by the number of non-padding target tokens in the *whole*
    update, so an update split into micro-batches gives the same gradient as one big batch.

    Args:
        micro_batches: objects with ``inputs`` (the tensors the model reads), ``tgt_out``
            (B, T) labels and an ``n_tgt_tokens`` int (see :class:`transformer.data.Batch`),
            and optionally ``options``, keywords for the model's forward, and ``scored``, where
            the labels are (:func:`scored_positions`).
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
    device = micro_batches[0].tgt_out.device
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = sum(int(b.n_tgt_tokens) for b in micro_batches)  # counted on the host when the batches were made
    if world > 1:  # every rank's tokens, kept on the device
        total = _all_reduce_sum(torch.tensor([float(total)], dtype=torch.float64, device=device),
                                wrapper.process_group)[0]
    denom = total.clamp(min=1) if isinstance(total, Tensor) else max(total, 1)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = nll_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, b in enumerate(micro_batches):
        select = scored_positions(b, model.cfg.pad_id)
        last = i == len(micro_batches) - 1
        with wrapper.no_sync() if ddp and not last else contextlib.nullcontext():
            gold = b.tgt_out.reshape(-1) if select is None else at_positions(b.tgt_out, select)
            loss, nll = loss_fn(forward, b.inputs, getattr(b, "options", {}), select, gold, epsilon, amp_dtype, loss_kernels)
            scaled = loss * world / (denom.to(loss.dtype) if isinstance(denom, Tensor) else denom)
            (grad_scaler.scale(scaled) if grad_scaler is not None else scaled).backward()
        loss_sum = loss_sum + loss.detach()
        nll_sum = nll_sum + nll.detach()
    if grad_scaler is not None:
        grad_scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm if clip_norm else math.inf)
    bad = ~(torch.isfinite(grad_norm) & torch.isfinite(loss_sum))
    if world > 1:  # a NaN on any rank skips the update on all of them
        summed = _all_reduce_sum(torch.stack([loss_sum, nll_sum, bad.double()]), wrapper.process_group)
        loss_sum, nll_sum, n_bad = summed.unbind()
        bad = (n_bad > 0) | ~torch.isfinite(loss_sum)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)  # skips the update itself on inf/nan
        grad_scaler.update()
    else:
        step_unless(optimizer, bad)
    return StepStats(loss_sum / denom, nll_sum / denom, total, grad_norm, lr, bad)


def scored_positions(batch, pad_id: int) -> Tensor | None:
    """Where ``batch.tgt_out`` (B, T) holds a label, for the model's ``select``: None when every
    position does (a language model's windows: no gather, no scatter back), else the (N,)
    indices into the flattened labels that the batch found on the host before it moved to its
    device (``batch.scored``), so that a GPU never waits to learn N; a batch that does not carry
    them gets a (B, T) bool mask (``batch.not_scored`` or ``pad_id`` where there is no label:
    a language model's pad_id may be a real token)."""
    if hasattr(batch, "scored"):
        return batch.scored
    return batch.tgt_out != getattr(batch, "not_scored", pad_id)


def step_unless(optimizer: torch.optim.Optimizer, bad: Tensor) -> None:
    """``optimizer.step()``, which changes nothing (weights, moments, step count) where ``bad``
    (a 0-d bool tensor) is True, without reading ``bad`` back to the host: torch's fused
    optimizers take it as the ``found_inf`` flag GradScaler hands them and skip on the device.
    Other optimizers read it (one synchronisation)."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        if not bool(bad):
            optimizer.step()
        return
    optimizer.grad_scale, optimizer.found_inf = None, bad.to(torch.float32)
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


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


def _all_reduce_sum(values: Tensor, group) -> Tensor:
    """``values`` summed over the ranks of ``group``, left on the device."""
    torch.distributed.all_reduce(values, group=group)
    return values
