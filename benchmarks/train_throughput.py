"""Training throughput: ours vs torch.nn.Transformer vs Hugging Face MarianMTModel.

Same shapes, same loss (label-smoothed cross-entropy, eps 0.1), Adam, one process, the
implementations interleaved round by round so that machine noise hits all of them alike.
Reports target tokens/s (median over rounds), the ratio to torch.nn.Transformer, and model
FLOPs utilisation (MFU) against the matmul peak measured in the same run.

    .venv/bin/python benchmarks/train_throughput.py [--config tiny] [--rounds 5] [--steps 5]

Two more measurements on the same implementations and shapes:

    --lengths 8,16,32,64,128   time against sentence length: batches of the same number of
                               tokens (batch x length = --batch x --tgt-len), so the growth
                               per token is the attention's quadratic term
    --memory                   peak memory of training: each implementation and dtype in a
                               fresh process (peak RSS, /proc/self/status VmHWM), against a
                               process that imports the same modules and builds no model
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from matmul_rate import matmul_rate  # benchmarks/ is the script's own folder, first on sys.path
from peak_memory import peak_rss_mib
from transformer import ModelConfig, Transformer, hardware
from transformer.train.loss import compile_loss
from transformer.train.update import paper_adam, train_step
from transformer.run.private import use_private_build_folder  # noqa: E402

use_private_build_folder()  # torch.compile below builds in the user's private cache, not a shared folder

COMPILED = "ours, compiled loss"
WHOLE = "ours, whole graph compiled"
MAX_LEN = 256  # the position table of every model built here
CONFIGS = {  # name: (layers, d_model, d_ff, heads)
    "tiny": (4, 128, 256, 4),  # the published Multi30k setting; our de-en and en-fr recipes
    "small": (3, 256, 1024, 4),
    "base": (6, 512, 2048, 8),  # the paper's base model
}


def model_flops(layers: int, d: int, d_ff: int, vocab: int, s: int, t: int, batch: int) -> float:
    """Forward + backward FLOPs of one step (3x the forward's matmul FLOPs)."""
    enc = layers * (4 * d * d + 2 * d * d_ff) * 2 * s + layers * 2 * 2 * s * s * d
    dec = layers * (8 * d * d + 2 * d * d_ff) * 2 * t + layers * 2 * 2 * (t * t + t * s) * d
    out = 2 * t * d * vocab
    return 3 * batch * (enc + dec + out)


class Batch:
    def __init__(self, src, tgt_in, tgt_out):
        self.src, self.tgt_in, self.tgt_out = src, tgt_in, tgt_out
        self.n_tgt_tokens = int((tgt_out != 0).sum())
        self.inputs = (src, tgt_in)  # what train_step feeds the model


class TorchNN(nn.Module):
    """torch.nn.Transformer with tied embeddings, sinusoid-free (positions don't change cost)."""

    def __init__(self, layers, d, d_ff, heads, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.core = nn.Transformer(d, heads, layers, layers, d_ff, dropout=0.1, batch_first=True)
        self.scale = math.sqrt(d)

    def forward(self, src, tgt):
        t = tgt.size(1)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        h = self.core(self.embed(src) * self.scale, self.embed(tgt) * self.scale, tgt_mask=causal,
                      src_key_padding_mask=src == 0, memory_key_padding_mask=src == 0)
        return h @ self.embed.weight.T


def make_peers(layers, d, d_ff, heads, vocab, compiled_loss: bool = False, whole_graph: bool = False):
    """The implementations to race, by name. With ``compiled_loss``, a second copy of ours (the
    same initial weights) trains with the compiled loss kernels (``compile_loss: true``); with
    ``whole_graph``, a copy whose forward (and so its backward) is one ``torch.compile`` graph
    at the batch's fixed shape, with the compiled loss kernels too."""

    def ours() -> Transformer:
        torch.manual_seed(0)
        return Transformer(ModelConfig(vocab_size=vocab, d_model=d, n_heads=heads, d_ff=d_ff, n_layers=layers,
                                       dropout=0.1, max_len=MAX_LEN))

    peers = {"ours": ours()}
    if compiled_loss:
        peers[COMPILED] = ours()
    if whole_graph:
        peers[WHOLE] = ours()
    peers["torch.nn.Transformer"] = TorchNN(layers, d, d_ff, heads, vocab)
    try:
        from transformers import MarianConfig, MarianMTModel

        mc = MarianConfig(vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
                          encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=d_ff,
                          decoder_ffn_dim=d_ff, dropout=0.1, activation_function="relu", pad_token_id=0,
                          decoder_start_token_id=0, eos_token_id=2, max_position_embeddings=MAX_LEN,
                          scale_embedding=True)
        peers["HF MarianMTModel"] = MarianMTModel(mc)
    except ImportError:
        print("transformers not installed: skipping the Marian peer", file=sys.stderr)
    return peers


def peer_step(model, batch, opt, amp):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        if isinstance(model, TorchNN):
            logits = model(batch.src, batch.tgt_in)
        else:
            logits = model(input_ids=batch.src, attention_mask=(batch.src != 0).long(),
                           decoder_input_ids=batch.tgt_in).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1),
                           ignore_index=0, label_smoothing=0.1, reduction="sum") / batch.n_tgt_tokens
    loss.backward()
    opt.step()


def make_batch(batch: int, src_len: int, tgt_len: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (batch, src_len), generator=g)
    tgt = torch.randint(4, vocab, (batch, tgt_len + 1), generator=g)
    return Batch(src, tgt[:, :-1], tgt[:, 1:])


def make_optimizer(name: str, model: nn.Module):
    if name.startswith("ours"):
        return paper_adam(model.parameters())
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)


def one_step(name: str, model: nn.Module, batch: Batch, opt, amp: bool, loss_kernels=None, forward=None) -> None:
    if name.startswith("ours"):
        train_step(model, [batch], opt, 1e-4, epsilon=0.1, amp_dtype=torch.bfloat16 if amp else None,
                   forward=forward, loss_kernels=loss_kernels)
    else:
        peer_step(model, batch, opt, amp)


def race(peers: dict, batch: Batch, amp: bool, rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step of each implementation, the implementations taking turns round by
    round (round 0 warms up and is not counted)."""
    opts = {k: make_optimizer(k, m) for k, m in peers.items()}
    kernels = {}  # implementation name -> its loss kernels (built once, shared)
    users = [name for name in (COMPILED, WHOLE) if name in peers]
    if users:
        shared = compile_loss(torch.bfloat16 if amp else torch.float32)
        if shared is None:
            sys.exit(f"{users[0]}: the compiled loss kernels are not usable here (see the warning above)")
        kernels = dict.fromkeys(users, shared)
    forwards = {WHOLE: torch.compile(peers[WHOLE], dynamic=False)} if WHOLE in peers else {}
    times: dict[str, list[float]] = {k: [] for k in peers}
    for r in range(rounds + 1):
        for name, model in peers.items():
            model.train()
            for _ in range(steps):
                t = time.perf_counter()
                one_step(name, model, batch, opts[name], amp, kernels.get(name), forwards.get(name))
                if r:
                    times[name].append(time.perf_counter() - t)
    return times


def emit(path: str | None, row: dict) -> None:
    """Append ``row`` and the machine it was measured on as one JSON line."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**row, "machine": hardware.describe()}) + "\n")


def throughput(args, layers, d, d_ff, heads) -> None:
    """The main table: tokens/s, ratio to torch.nn.Transformer and MFU, per dtype."""
    batch = make_batch(args.batch, args.src_len, args.tgt_len, args.vocab)
    flops = model_flops(layers, d, d_ff, args.vocab, args.src_len, args.tgt_len, args.batch)
    tokens = args.batch * args.tgt_len
    for dt in args.dtypes.split(","):
        amp = dt == "bf16"
        peak = matmul_rate(torch.bfloat16 if amp else torch.float32, args.matmul_sizes)
        peers = make_peers(layers, d, d_ff, heads, args.vocab, compiled_loss=args.compile_loss,
                           whole_graph=args.compile)
        times = race(peers, batch, amp, args.rounds, args.steps)
        ref = statistics.median(times["torch.nn.Transformer"])
        print(f"\n{dt}: matmul peak {peak / 1e9:.0f} GFLOP/s (best of {', '.join(f'{n}^3' for n in args.matmul_sizes)}; "
              "same run)")
        print("| implementation | step ms (median) | target tokens/s | vs torch.nn.Transformer | MFU |")
        print("|---|---|---|---|---|")
        for name, ts in times.items():
            med = statistics.median(ts)
            row = {"config": args.config, "dtype": dt, "impl": name, "step_ms": med * 1e3,
                   "tokens_per_s": tokens / med, "ratio": ref / med, "mfu": flops / med / peak,
                   "peak_gflops": peak / 1e9}
            print(f"| {name} | {med * 1e3:.0f} | {tokens / med:,.0f} | {ref / med:.2f}x | {row['mfu']:.1%} |")
            emit(args.json, row)


def lengths(args, layers, d, d_ff, heads) -> None:
    """Time against sentence length at a fixed number of tokens per batch: source and target
    both L tokens, batch = (--batch x --tgt-len) // L sentences."""
    budget = args.batch * args.tgt_len
    for dt in args.dtypes.split(","):
        amp = dt == "bf16"
        peers = make_peers(layers, d, d_ff, heads, args.vocab)
        per_token: dict[int, dict[str, float]] = {}
        for length in args.lengths:
            n = max(1, budget // length)
            times = race(peers, make_batch(n, length, length, args.vocab), amp, args.rounds, args.steps)
            per_token[length] = {k: statistics.median(v) / (n * length) for k, v in times.items()}
            for name, sec in per_token[length].items():
                emit(args.json, {"config": args.config, "dtype": dt, "impl": name, "length": length,
                                 "batch": n, "us_per_target_token": sec * 1e6})
        first, last = args.lengths[0], args.lengths[-1]
        print(f"\n{dt}: microseconds per target token, batches of ~{budget} target tokens "
              f"(source and target L tokens each)")
        print("| implementation | " + " | ".join(f"L={L}" for L in args.lengths) + f" | L={last} / L={first} |")
        print("|---|" + "---|" * (len(args.lengths) + 1))
        for name in peers:
            cells = " | ".join(f"{per_token[L][name] * 1e6:.1f}" for L in args.lengths)
            print(f"| {name} | {cells} | {per_token[last][name] / per_token[first][name]:.2f}x |")


def memory_child(args, layers, d, d_ff, heads) -> None:
    """Build one implementation, train it for --steps steps, print the peak RSS as JSON."""
    impl, dt = args.memory_child.split(":")
    try:  # every child imports the same modules, so that "none" is the common baseline
        import transformers  # noqa: F401
    except ImportError:
        pass
    if impl != "none":
        model = make_peers(layers, d, d_ff, heads, args.vocab)[impl]
        batch = make_batch(args.batch, args.src_len, args.tgt_len, args.vocab)
        opt = make_optimizer(impl, model)
        model.train()
        for _ in range(args.steps):
            one_step(impl, model, batch, opt, dt == "bf16")
    print(json.dumps({"impl": impl, "dtype": dt, "peak_rss_mib": peak_rss_mib()}))


def memory(args) -> None:
    """Peak RSS of training, each implementation and dtype in a fresh process."""
    argv = [a for a in sys.argv[1:] if a != "--memory"]
    names = ["ours", "torch.nn.Transformer", "HF MarianMTModel"]
    print(f"\npeak memory (MiB, fresh process each; 'none' builds no model; {args.steps} steps)")
    print("| dtype | none | " + " | ".join(names) + " |")
    print("|---|" + "---|" * (len(names) + 1))
    for dt in args.dtypes.split(","):
        cells = []
        for impl in ["none", *names]:
            done = subprocess.run([sys.executable, __file__, *argv, "--memory-child", f"{impl}:{dt}"],
                                  capture_output=True, text=True, env=os.environ.copy())
            if done.returncode != 0:
                raise RuntimeError(f"memory child {impl}:{dt} failed:\n{done.stderr[-2000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            emit(args.json, {"config": args.config, **row})
            cells.append(f"{row['peak_rss_mib']:,.0f}")
        print(f"| {dt} | " + " | ".join(cells) + " |")


def _lengths(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--src-len", type=int, default=16)
    ap.add_argument("--tgt-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per implementation per round")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--lengths", type=_lengths,
                    help="comma-separated sentence lengths: time against length instead of the main table")
    ap.add_argument("--memory", action="store_true", help="also measure peak memory, a fresh process each")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="append results as JSON lines to this file")
    ap.add_argument("--matmul-sizes", type=_lengths, default=(2048, 3072, 4096),
                    help="square matmuls whose best rate MFU is measured against (smaller: quicker, lower)")
    ap.add_argument("--compile-loss", action="store_true",
                    help="main table: also race ours with the compiled loss kernels (compile_loss: true)")
    ap.add_argument("--compile", action="store_true",
                    help="main table: also race ours with the whole forward and backward compiled at the "
                         "batch's fixed shape (torch.compile, dynamic=False), with the compiled loss")
    args = ap.parse_args()
    if args.lengths and not all(1 <= n <= MAX_LEN for n in args.lengths):
        ap.error(f"--lengths: every length must be between 1 and {MAX_LEN} (the models' position table)")
    layers, d, d_ff, heads = CONFIGS[args.config]
    if args.memory_child:
        return memory_child(args, layers, d, d_ff, heads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    print(f"config {args.config}: {layers}+{layers} layers, d_model {d}, d_ff {d_ff}, {heads} heads, vocab "
          f"{args.vocab}; batch {args.batch} x {args.src_len}+{args.tgt_len} tokens; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    if args.lengths:
        lengths(args, layers, d, d_ff, heads)
    else:
        throughput(args, layers, d, d_ff, heads)
    if args.memory:
        memory(args)


if __name__ == "__main__":
    main()
