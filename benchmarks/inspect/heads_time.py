"""How long ``transformer heads`` takes to measure every head of a translation model on one
sentence: the time of :func:`transformer.inspect.head_effects` (every head of the encoder,
decoder self- and cross-attention, in batched passes), of the logit lens, and of one plain
forward pass for scale. Random weights of each size (the time does not depend on them):

    demo      the ``tiny`` preset that configs/demo.yaml trains (4+4 layers, d_model 128,
              4 heads, FFN 512) with its 8,000 subwords
    opus-mt   the size of Helsinki-NLP's opus-mt models (6+6 layers, d_model 512, 8 heads,
              FFN 2048, 58,101 subwords, tied, post-norm, output bias)

A source and a target of ``--length`` tokens each; the score is the log-probability of the
whole target (every position projected to the vocabulary, the costliest score). Median of
``--rounds`` after one warm-up.

    .venv/bin/python benchmarks/inspect/heads_time.py [--length 20] [--rounds 3] [--threads 2]
    .venv/bin/python benchmarks/inspect/heads_time.py --run runs/demo   # a trained run instead
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from transformer import ModelConfig, Transformer, hardware
from transformer.inspect import Score, head_effects, logit_lens

SIZES = {
    "demo": dict(name="tiny", vocab_size=8000),
    "opus-mt": dict(name="base", vocab_size=58101, output_bias=True, sinusoid_layout="concat"),
}


def timed(fn, rounds: int) -> tuple[float, float]:
    """The median wall time and the median CPU time (all threads) of ``fn``: on a shared
    machine the CPU time / threads is what the wall time would be with the cores to itself."""
    fn()
    walls, cpus = [], []
    for _ in range(rounds):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def shown(t: tuple[float, float]) -> str:
    return f"{t[0]:.2f} s ({t[1]:.2f} s CPU)"


def measure(name: str, model, length: int, rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    v = model.cfg.target_vocab_size
    src = torch.cat([torch.randint(4, v, (1, length - 1), generator=g), torch.tensor([[model.cfg.eos_id]])], 1)
    tgt = torch.cat([torch.tensor([[model.cfg.bos_id]]), torch.randint(4, v, (1, length - 1), generator=g)], 1)
    out = [*tgt[0, 1:].tolist(), model.cfg.eos_id]
    score = Score(list(range(length)), out)
    heads = 3 * model.cfg.n_layers * model.cfg.n_heads
    corrupt = (torch.roll(src, 1, dims=1), tgt)
    with torch.no_grad():
        forward = timed(lambda: model(src, tgt), rounds)
    zero = timed(lambda: head_effects(model, (src, tgt), score), rounds)
    patch = timed(lambda: head_effects(model, (src, tgt), score, ablate="patch", corrupt=corrupt), rounds)
    lens = timed(lambda: logit_lens(model, src, tgt), rounds)
    print(f"| {name} | {heads} | {length} | {shown(zero)} | {shown(patch)} | {shown(lens)} | {shown(forward)} |",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default="demo,opus-mt")
    parser.add_argument("--run", help="a trained translation run instead of the random sizes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(hardware.describe_line())
    print(f"{args.threads} threads; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| model | heads | tokens (source, target) | heads, ablation | heads, patching | lens | forward |")
    print("|---|---|---|---|---|---|---|")
    if args.run:
        from transformer.run import load_model

        model, _ = load_model(args.run)
        measure(args.run, model.float().eval(), args.length, args.rounds)
        return
    for name in args.sizes.split(","):
        torch.manual_seed(0)
        model = Transformer(ModelConfig.preset(**SIZES[name], dropout=0.0)).eval()
        measure(name, model, args.length, args.rounds)


if __name__ == "__main__":
    main()
