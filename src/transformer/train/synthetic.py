"""A tiny synthetic task: copy or reverse a random sequence of symbols.

A small Transformer learns it from scratch on a CPU in well under a minute; it is the
quickest end-to-end check that the model, loss, schedule and decoding work together.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..model.config import ModelConfig
from ..decode import greedy_search
from ..model import Transformer
from .schedule import linear_decay_lr
from .update import paper_adam, train_step

N_SPECIAL = 4  # pad 0, bos 1, eos 2, unk 3 (the data layer's ids)


@dataclass
class SyntheticBatch:
    src: torch.Tensor  # (B, S) symbols + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + target
    tgt_out: torch.Tensor  # (B, T) target + EOS
    n_tgt_tokens: int
    target: list[list[int]]  # the expected output, without EOS

    @property
    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.src, self.tgt_in


def make_batch(task: str, batch_size: int, n_symbols: int, min_len: int, max_len: int,
               gen: torch.Generator, pad: int = 0, bos: int = 1, eos: int = 2) -> SyntheticBatch:
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=gen).tolist()
    seqs = [torch.randint(N_SPECIAL, N_SPECIAL + n_symbols, (n,), generator=gen).tolist() for n in lengths]
    targets = [s[::-1] if task == "reverse" else list(s) for s in seqs]
    width = max(lengths) + 1
    src = torch.full((batch_size, width), pad, dtype=torch.long)
    tgt_in = torch.full((batch_size, width), pad, dtype=torch.long)
    tgt_out = torch.full((batch_size, width), pad, dtype=torch.long)
    for i, (s, t) in enumerate(zip(seqs, targets)):
        src[i, : len(s) + 1] = torch.tensor(s + [eos])
        tgt_in[i, : len(t) + 1] = torch.tensor([bos] + t)
        tgt_out[i, : len(t) + 1] = torch.tensor(t + [eos])
    return SyntheticBatch(src, tgt_in, tgt_out, int((tgt_out != pad).sum()), targets)


def exact_match(model: Transformer, batch: SyntheticBatch) -> float:
    """Fraction of sequences whose greedy output equals the target exactly."""
    model.eval()
    hyps = greedy_search(model, batch.src, max_len_b=5)
    eos = model.cfg.eos_id
    ok = sum(h[0].tokens == t + [eos] for h, t in zip(hyps, batch.target))
    return ok / len(batch.target)


def train_synthetic(task: str = "reverse", steps: int = 800, n_symbols: int = 16, min_len: int = 3,
                    max_len: int = 12, batch_size: int = 128, peak_lr: float = 2e-3, warmup: int = 100,
                    seed: int = 0, log=print, log_every: int = 200) -> tuple[Transformer, float]:
    """Train a toy Transformer on the task; returns (model, exact-match accuracy on 1,000
    held-out sequences)."""
    if task not in ("copy", "reverse"):
        raise ValueError(f"task must be 'copy' or 'reverse', got {task!r}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = ModelConfig.preset("toy", vocab_size=N_SPECIAL + n_symbols, dropout=0.0, max_len=max_len + 60)
    model = Transformer(cfg)
    optimizer = paper_adam(model.parameters())
    held_out = make_batch(task, 1000, n_symbols, min_len, max_len, torch.Generator().manual_seed(seed + 1))
    start = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        batch = make_batch(task, batch_size, n_symbols, min_len, max_len, gen)
        stats = train_step(model, [batch], optimizer, linear_decay_lr(step, peak_lr, warmup, steps), epsilon=0.0)
        if step % log_every == 0 or step == steps:
            acc = exact_match(model, held_out)
            log(f"step {step:5d}  loss {stats.loss:.4f}  lr {stats.lr:.2e}  "
                f"held-out exact match {acc:.1%}  ({time.perf_counter() - start:.0f}s)")
            if acc == 1.0:
                break
    return model, exact_match(model, held_out)
