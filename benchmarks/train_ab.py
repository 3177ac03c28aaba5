"""A/B of training-step variants in one process, on real batches of the en->de recipe.

Each variant is a switch on the current code (the unfused variant puts back three separate
Q, K, V matmuls; the loss variants set the row-block size or use the compiled loss kernels of
``compile_loss``), so a change is measured against
what it replaced, side by side: the variants take turns block by block (``--steps`` updates a
block, ``--blocks`` blocks each, the same batches for every variant), and the table gives the
median target tokens/s and the ratio to the first variant. bf16 autocast, as the recipe.
With ``--d-ff 256,512`` the variants are instead models of those FFN widths (each its own
model and optimizer, from the same seed), all on the current code with the compiled loss.
(The ``--output full,restricted`` race of the removed ``restrict_output`` option is in this
file's history, at commit 757600f.)

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/train_ab.py [--run runs/multi30k-en-de] [--d-ff 256,512]

Without ``--run`` a joint 8k BPE is learned on the training text first (~20 s).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import transformer.train.loss as loss_module
from transformer import ModelConfig, Transformer, hardware
from transformer.data import (Subwords, TokenBatchSampler, clean_pairs, collate, example_lengths, load_multi30k,
                              train_subwords)
from transformer.train.update import paper_adam, train_step

attention_module = sys.modules["transformer.model.attention"]
transformer_module = sys.modules["transformer.model.transformer"]
FUSED = attention_module.fused_projection


def unfused_projection(x, linears, d_head):
    """The replaced code: one matmul per linear layer."""
    b, t, _ = x.shape
    return [lin(x).view(b, t, -1, d_head).transpose(1, 2) for lin in linears]


VARIANTS = {  # name: (projection, loss row-block elements, compiled loss kernels)
    "before": (unfused_projection, 1 << 18, False),
    "fused-qkv": (FUSED, 1 << 18, False),
    "loss-4MB": (unfused_projection, 1 << 20, False),
    "now": (FUSED, 1 << 20, False),
    "compiled-loss": (FUSED, 1 << 20, True),
}


@functools.cache
def compiled_loss():
    """The compiled loss kernels for bf16 logits, built once."""
    kernels = loss_module.compile_loss(dtype=torch.bfloat16)
    if kernels is None:
        raise SystemExit("compile_loss failed on this machine (see the warning above)")
    return kernels


def use(variant: str):
    """Switch to ``variant``; returns the loss kernels it uses (None: eager)."""
    projection, block, compiled = VARIANTS[variant]
    attention_module.fused_projection = transformer_module.fused_projection = projection
    loss_module._CHUNK_ELEMENTS = block
    return compiled_loss() if compiled else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run directory whose subwords.model to use")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--d-ff", help="comma-separated FFN widths to race instead of the code variants")
    args = ap.parse_args()
    print(f"machine: {hardware.describe_line()}", flush=True)
    widths = [int(w) for w in args.d_ff.split(",")] if args.d_ff else []
    names = [f"d_ff={w}" for w in widths] or args.variants.split(",")
    torch.manual_seed(0)
    pairs, _ = clean_pairs(load_multi30k("train", "en", "de"))
    if args.run:
        sw = Subwords.load(Path(args.run) / "subwords.model")
    else:
        sw = train_subwords([s for p in pairs for s in p], Path(tempfile.mkdtemp()) / "sw", vocab_size=8000)
    encoded = [(sw.encode(s), sw.encode(t)) for s, t in pairs]
    examples = encoded[:12000]
    cfg = ModelConfig.preset("tiny", vocab_size=sw.vocab_size, dropout=0.2)

    def build(config: ModelConfig):
        model = Transformer(config).train()
        return model, paper_adam(model.parameters())

    if widths:  # each width its own model and optimizer, from the same seed
        trained = {}
        for name, width in zip(names, widths):
            torch.manual_seed(0)
            trained[name] = build(dataclasses.replace(cfg, d_ff=width))
    else:  # the code variants train one shared model in turn
        trained = dict.fromkeys(names, build(cfg))
    sampler = TokenBatchSampler(example_lengths(examples), 2048, 1)
    n_batches = 5 + 5 * args.steps
    batches = [collate([examples[i] for i in idx], cfg.pad_id, cfg.bos_id, cfg.eos_id)
               for idx in list(sampler)[:n_batches]]

    def block(name, bs) -> int:
        kernels = use("compiled-loss" if widths else name)
        model, opt = trained[name]
        return sum(train_step(model, [b], opt, 1e-4, amp_dtype=torch.bfloat16, loss_kernels=kernels).n_tokens
                   for b in bs)

    for name in names:  # warm-up
        block(name, batches[:5])
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.blocks):
        start = 5 + (r % 5) * args.steps
        for name in names:
            t = time.perf_counter()
            n = block(name, batches[start:start + args.steps])
            rates[name].append(n / (time.perf_counter() - t))
    use("now")
    base = statistics.median(rates[names[0]])
    print(f"{args.blocks} blocks of {args.steps} updates per variant, ~{statistics.mean(b.n_tgt_tokens for b in batches):.0f} "
          f"target tokens an update, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| variant | target tokens/s (median) | vs first |\n|---|---|---|")
    for name in names:
        m = statistics.median(rates[name])
        print(f"| {name} | {m:,.0f} | {m / base:.3f}x |")


if __name__ == "__main__":
    main()
