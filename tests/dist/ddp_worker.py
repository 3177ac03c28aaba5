"""One rank of a test run under torchrun: ``ddp_worker.py RUN_DIR DUMP_DIR KEY=VALUE...``.

Trains with Trainer on the group torchrun describes, then writes this rank's weights to
DUMP_DIR/rank{R}.safetensors (also after a UserError, which it prints like the CLI and
exits 2). With NAN_UPDATES="2,5,6" rank 1 alone (!) makes NaN logits on those updates.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from transformer.errors import UserError
from transformer.train import distributed
from transformer.run import unique_state_dict
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer


def nan_on_rank1(trainer: Trainer, updates: set[int]) -> None:
    model, real, calls = trainer.model, trainer.model.forward, {"n": 0}

    def forward(*args, **kwargs):
        out = real(*args, **kwargs)
        if model.training:
            calls["n"] += 1  # accum_steps=1: one forward per update
            if calls["n"] in updates:
                out = out * float("nan")
        return out

    model.forward = forward


def main() -> int:
    torch.set_num_threads(1)
    run_dir, dump, overrides = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    group = distributed.from_env("cpu")
    assert group.world_size == int(os.environ["WORLD_SIZE"]) and group.device.type == "cpu"
    code, trainer = 0, None
    try:
        trainer = Trainer(load_config(None, overrides), run_dir, dist=group)
        nan = os.environ.get("NAN_UPDATES")
        if nan and group.rank == 1:
            nan_on_rank1(trainer, {int(x) for x in nan.split(",")})
        trainer.train()
    except UserError as e:
        sys.stderr.write(f"rank {group.rank}: error: {e}\n")  # one write: the ranks' lines must not interleave
        code = 2
    finally:
        distributed.shutdown()
    if trainer is not None:
        save_file(unique_state_dict(trainer.model), str(dump / f"rank{group.rank}.safetensors"))
    return code


if __name__ == "__main__":
    sys.exit(main())
