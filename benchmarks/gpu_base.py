"""The paper's base model on one GPU: train on Multi30k-shaped batches, then decode.

    .venv/bin/python benchmarks/gpu_base.py --minutes 3            # on a GPU machine
    .venv/bin/python benchmarks/gpu_base.py --batch 1000 --length 25 --vocab 37000 --steps 40 --peer   # the paper's batch
    .venv/bin/python benchmarks/gpu_base.py --device cpu --steps 3 --decode 8 --precision fp32   # smoke test

The paper's batch is about 25,000 source and 25,000 target tokens an update (``--batch 1000
--length 25``); ``--peer`` also trains ``torch.nn.Transformer`` at the same shape, precision
and loss, the two taking turns, and reports the ratio of their tokens/s.

Records training target tokens/s (bf16 autocast, or fp32: --precision; auto is bf16 where the
device computes it natively, a GPU or an AMX / AVX512-BF16 CPU, else fp32), MFU against both
the matmul rate of that precision measured in the same run and the nominal peak
(--peak-tflops, 790 for an H200's bf16), peak memory, and beam-4 / greedy decoding throughput
over the test set's source sentences (random weights, so the output length is forced to 20
tokens as in the peers' anchor figures). Prints the machine (transformer.hardware), a Markdown
table and, with --json, writes the figures, the precision and the machine to a file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from matmul_rate import matmul_rate, sync  # benchmarks/ is the script's own folder, first on sys.path
from transformer import ModelConfig, Transformer, hardware
from transformer.decode import beam_search, greedy_search, pad_batch
from transformer.train.update import paper_adam, train_step


def step_flops(cfg: ModelConfig, batch: int, s: int, t: int) -> float:
    """Forward + backward matmul FLOPs of one update (3x the forward)."""
    d, f, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    enc = n * (4 * d * d + 2 * d * f) * 2 * s + n * 4 * s * s * d
    dec = n * (8 * d * d + 2 * d * f) * 2 * t + n * 4 * (t * t + t * s) * d
    return 3 * batch * (enc + dec + 2 * t * d * cfg.vocab_size)


class Batch:
    """One batch as the training loop hands it to ``train_step``: made on the host, its labels
    counted there (random ids >= 4 hold no padding), then moved."""

    def __init__(self, src, tgt, device):
        self.n_tgt_tokens = int((tgt[:, 1:] != 0).sum())
        self.scored, self.options = None, {"src_padded": False}
        self.src, self.tgt_in, self.tgt_out = src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)
        self.inputs = (self.src, self.tgt_in)  # what train_step feeds the model


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` at the same shape: tied embeddings scaled by sqrt(d_model), the
    causal mask it makes itself (``tgt_is_causal``), no positional encoding (it costs nothing)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=0)
        self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.n_layers, cfg.d_ff,
                                   dropout=cfg.dropout, batch_first=True)
        self.scale = cfg.d_model ** 0.5

    def forward(self, src, tgt):
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.core(self.embed(src) * self.scale, self.embed(tgt) * self.scale, tgt_mask=causal, tgt_is_causal=True)
        return h @ self.embed.weight.T  # (B, T, V)


def peer_update(model, opt, batch: Batch, amp: bool, device: torch.device) -> None:
    """One update of the peer: the same label-smoothed loss per target token, fused Adam."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(batch.src, batch.tgt_in)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0,
                           label_smoothing=0.1, reduction="sum") / batch.n_tgt_tokens
    loss.backward()
    opt.step()


def timed(update, args, device: torch.device, budget_s: float) -> list[float]:
    """Seconds per update (each waited for), ``--steps`` of them or as many as ``budget_s`` allows."""
    times, start = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        update()
        sync(device)
        times.append(time.perf_counter() - t)
        if args.steps and len(times) >= args.steps:
            return times
        if not args.steps and time.perf_counter() - start > budget_s:
            return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--minutes", type=float, default=3.0, help="training time to measure")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many updates instead (0 = by time)")
    ap.add_argument("--batch", type=int, default=512, help="sentence pairs per update")
    ap.add_argument("--length", type=int, default=16, help="source and target tokens per sentence (Multi30k: ~14)")
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--decode", type=int, default=1000, help="test-set sentences to decode (0 = skip)")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="training and decoding: bf16 autocast or fp32 (auto: bf16 where the device computes it "
                         "natively, else fp32)")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="nominal peak of the precision (H200, bf16: ~790)")
    ap.add_argument("--peer", action="store_true", help="also train torch.nn.Transformer at the same shape and precision")
    ap.add_argument("--compile", action="store_true",
                    help="also train our model with its forward (and so its backward) compiled at this one shape: "
                         "what a translation run could gain from torch.compile, were its shapes bucketed")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_base.py: no CUDA device here; use --device cpu for a smoke test")
    print(f"machine: {hardware.describe_line()}", flush=True)
    precision = hardware.resolve(args.precision, device)
    amp = precision == "bf16"  # fp32: no autocast
    dtype = torch.bfloat16 if amp else torch.float32
    torch.manual_seed(0)
    cfg = ModelConfig.preset("base", vocab_size=args.vocab, max_len=256)
    model = Transformer(cfg).to(device)
    opt = paper_adam(model.parameters())
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, args.vocab, (args.batch, args.length), generator=g)
    tgt = torch.randint(4, args.vocab, (args.batch, args.length + 1), generator=g)
    batch = Batch(src, tgt, device)
    # TFLOP/s; on a CPU (a smoke test) a small product, so that it takes a second, not minutes
    measured = matmul_rate(dtype, (8192,) if device.type == "cuda" else (1024,), device) / 1e12
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    budget = args.minutes * 60 / (1 + args.peer + args.compile)
    times = timed(lambda: train_step(model, [batch], opt, 1e-4, amp_dtype=dtype if amp else None), args, device, budget)
    steady = times[min(3, len(times) - 1):]  # the first updates include warm-up
    step = statistics.median(steady)
    flops = step_flops(cfg, args.batch, args.length, args.length) / step / 1e12
    train_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "precision": precision,
           "params_M": model.num_parameters() / 1e6, "batch": args.batch, "length": args.length, "vocab": args.vocab,
           "updates": len(times), "step_ms": step * 1e3,
           "train_tgt_tokens_per_s": args.batch * args.length / step, "model_tflops": flops,
           "matmul_tflops_measured": measured, "mfu_vs_measured": flops / measured,
           "mfu_vs_nominal": flops / args.peak_tflops, "train_peak_mem_GiB": train_mem}
    if args.peer:
        torch.manual_seed(0)
        peer = TorchTransformer(cfg).to(device).train()
        peer_opt = torch.optim.Adam(peer.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        peer_times = timed(lambda: peer_update(peer, peer_opt, batch, amp, device), args, device, budget)
        peer_step = statistics.median(peer_times[min(3, len(peer_times) - 1):])
        out.update(peer_step_ms=peer_step * 1e3, peer_tgt_tokens_per_s=args.batch * args.length / peer_step,
                   ours_vs_torch_nn=peer_step / step)
        del peer, peer_opt
    if args.compile:
        from transformer.train.torch_compile import compiled_training

        torch.manual_seed(0)
        twin = Transformer(cfg).to(device)
        twin_opt = paper_adam(twin.parameters())
        _, loss_fn = compiled_training(twin, None, cpu=device.type == "cpu")  # as compile: true builds it, fullgraph
        twin_times = timed(lambda: train_step(twin, [batch], twin_opt, 1e-4, amp_dtype=dtype if amp else None,
                                              loss_fn=loss_fn), args, device, budget)
        twin_step = statistics.median(twin_times[min(3, len(twin_times) - 1):])
        out.update(compiled_step_ms=twin_step * 1e3, compiled_vs_eager=step / twin_step)
        del twin, twin_opt, loss_fn

    if args.decode:
        from transformer.data import load_multi30k
        from transformer.data.subwords import train_subwords

        pairs = load_multi30k("test_2016_flickr", "en", "de")
        with tempfile.TemporaryDirectory() as tmp:  # a small BPE gives realistic source lengths
            sw = train_subwords([s for s, _ in pairs], Path(tmp) / "sw", vocab_size=min(1000, args.vocab))
            ids = sorted((sw.encode(s)[:100] + [cfg.eos_id] for s, _ in pairs[: args.decode]), key=len)
        model.eval()
        for name, search in (("beam4", lambda x: beam_search(model, x, 4, 0.6, max_len_a=0, max_len_b=20, min_length=20)),
                             ("greedy", lambda x: greedy_search(model, x, max_len_a=0, max_len_b=20, min_length=20))):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            t = time.perf_counter()
            n_tokens = 0
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                for i in range(0, len(ids), 128):
                    hyps = search(pad_batch(ids[i:i + 128], cfg.pad_id, device))
                    n_tokens += sum(len(h[0].tokens) for h in hyps)
            sync(device)
            secs = time.perf_counter() - t
            out[f"decode_{name}_tokens_per_s"] = n_tokens / secs
            out[f"decode_{name}_sentences_per_s"] = len(ids) / secs
            out[f"decode_{name}_peak_mem_GiB"] = (torch.cuda.max_memory_allocated(device) / 2**30
                                                  if device.type == "cuda" else float("nan"))
    print("| figure | value |\n|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v:,.3f} |" if isinstance(v, float) else f"| {k} | {v} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "machine": hardware.describe()}, f, indent=1)


if __name__ == "__main__":
    main()
