"""Data-parallel training across processes started by ``torchrun`` (one process per GPU, or
several CPU processes with gloo).

Each process (rank) holds a full copy of the model, reads its own shard of every epoch's
token-bucketed batches and computes gradients on it; DistributedDataParallel averages the
gradients across ranks, so every rank makes the same update and the weights stay identical.
Only rank 0 writes files (checkpoints, metrics, best weights) and validates.

The global batch of one update is ``world_size x accum_steps`` micro-batches of at most
``max_tokens`` padded tokens each; the learning-rate schedule counts updates, so a run keeps
its trajectory when the number of ranks changes as long as ``world_size x accum_steps`` stays
the same (see docs/distributed.md).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..errors import UserError
from ..hardware import device_problem, resolve_device

# Collectives of the training loop: long enough for rank 0 to validate (greedy BLEU on a
# dev set) while the others wait at the next one.
TIMEOUT = timedelta(minutes=30)
# Waiting for rank 0's file work: above all learning the subwords of a large corpus at the
# first start (sentencepiece on WMT14's 9M sentences takes a long while).
RANK0_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class Dist:
    """Where this process stands in the group; ``Dist()`` is a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    objects: Any = field(default=None, compare=False, repr=False)  # gloo group for Python objects

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- collectives (identities for a single process) ------------------------------------
    def any(self, flags: list[int]) -> list[int]:
        """Element-wise maximum over ranks (non-negative int flags): a stop any rank asks for.
        Through the CPU group (gloo), so that asking, after every update, does not make a GPU
        finish its queue of kernels first."""
        if not self.enabled:
            return list(flags)
        t = torch.tensor(flags, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.objects)
        return [int(x) for x in t.tolist()]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.objects)
        return out

    def on_main(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on rank 0 only and hand its result to every rank. A UserError raised
        there is raised on every rank, so no rank is left waiting for the others."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except UserError as e:
                if not self.enabled:
                    raise
                error = str(e)
        if self.enabled:
            box = [(result, error)]
            dist.broadcast_object_list(box, src=0, group=self.objects)
            result, error = box[0]
        if error is not None:
            raise UserError(error)
        return result


def from_env(device: str = "auto") -> Dist:
    """The process group torchrun describes in the environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT), joined with NCCL on GPUs (this rank uses
    ``cuda:LOCAL_RANK``) and gloo on CPUs; a single process when those are not set."""
    device = resolve_device(device)  # auto: a CUDA GPU when there is one
    world = int(os.environ.get("WORLD_SIZE", "1"))
    single = world <= 1 or "RANK" not in os.environ
    # checked before the data is read; under torchrun cuda:N means cuda:LOCAL_RANK (checked below)
    problem = device_problem(device if single else device.partition(":")[0])
    try:
        requested = torch.device(device)
    except (RuntimeError, ValueError):
        problem = device_problem(device)
    if problem:
        raise UserError(f"--device {device}: {problem}")
    if single:
        return Dist(device=requested)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if requested.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA GPU visible to rank {rank}")
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"rank {rank}: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s); "
                            "use --nproc_per_node <= the number of GPUs")
        dev = torch.device("cuda", local_rank)  # one GPU per process, whatever index --device named
        torch.cuda.set_device(dev)
        backend = "nccl"
    elif requested.type == "cpu":
        dev, backend = torch.device("cpu"), "gloo"
    else:
        raise UserError(f"--device {device}: distributed training runs on cpu or cuda")
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=TIMEOUT, **kwargs)
    objects = dist.new_group(backend="gloo", timeout=RANK0_TIMEOUT)
    return Dist(rank, world, local_rank, dev, objects)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def reshard_position(state: dict[str, int], old_world: int, new_world: int) -> tuple[dict[str, int], int]:
    """Map a sampler position saved by a run on ``old_world`` ranks to ``new_world`` ranks.

    Every rank builds the same list of batches for an epoch and rank k takes batches
    k, k + N, k + 2N, ...; after ``b`` batches per rank the epoch's first ``b * old_world``
    batches are done. On ``new_world`` ranks the run continues with batch
    ``ceil(b * old_world / new_world) * new_world`` of the epoch: exactly where it stopped
    when ``new_world`` divides the batches done (always so when ``world_size x accum_steps``
    is kept), otherwise it skips fewer than ``new_world`` batches of that epoch, never
    repeating one.

    Returns:
        ``(state for each rank of the new run, number of batches skipped)``.
    """
    done = int(state["batch_in_epoch"]) * old_world
    per_rank = math.ceil(done / new_world)
    return {**state, "batch_in_epoch": per_rank}, per_rank * new_world - done
