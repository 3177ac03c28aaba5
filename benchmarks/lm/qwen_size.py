"""Generation at the size people import: a Qwen2-0.5B-shaped language model, ours against
Hugging Face ``generate()``, side by side in one process.

The model: HF ``Qwen2Config`` as Qwen2-0.5B (hidden 896, 24 layers, 14 heads with 2 key-value
heads, FFN 4864, vocabulary 151,936 tied to the output, q/k/v biases, rotary positions with
theta 1e6), random weights (HF's own initialisation, seeded), converted to ours by
``transformer.interop.from_llama``, the conversion ``transformer import`` makes of a Qwen2
folder. Greedy, ``--new`` new tokens after a ``--prompt``-token random prompt, every system
forced to make all of them (no stop id), at each batch of ``--batches``:

    ours-P    ``transformer.decode.generate`` (temperature 0) on ``for_inference(model, P)``:
              ``auto`` is what ``transformer generate`` does by default (fp32 or bf16, whichever
              measured faster here), ``int8`` what ``--precision int8`` does (each layer's
              kernel measured), eager
    hf-fp32   ``Qwen2ForCausalLM.generate()`` (greedy, ``min_new_tokens`` = ``max_new_tokens``)

Rounds rotate which system goes first (after one untimed short warm-up each); figures are
medians over rounds. Multiply-adds are counted from the shapes (the prompt once, every new
token through every layer and the output projection) and set against
``benchmarks/matmul_rate.py``'s fp32 and bf16 rates, measured before and after the rounds.

    .venv/bin/python -W ignore benchmarks/lm/qwen_size.py [--batches 1,8] [--new 128] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matmul_rate import matmul_rate  # noqa: E402

from transformer import hardware  # noqa: E402

SYSTEMS = ("ours-auto", "ours-int8", "ours-fp32", "hf-fp32")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--prompt", type=positive, default=16, help="prompt tokens")
    ap.add_argument("--new", type=positive, default=128, help="new tokens")
    ap.add_argument("--rounds", type=positive, default=3)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: ours-P (auto, fp32, bf16, int8), hf-fp32")
    ap.add_argument("--hidden", type=positive, default=896)
    ap.add_argument("--layers", type=positive, default=24)
    ap.add_argument("--heads", type=positive, default=14)
    ap.add_argument("--kv-heads", type=positive, default=2)
    ap.add_argument("--ffn", type=positive, default=4864)
    ap.add_argument("--vocab", type=positive, default=151936)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--matmul-sizes", default="1024,2048", help="benchmarks/matmul_rate.py's square sizes")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    try:
        args.sizes = tuple(positive(s) for s in args.matmul_sizes.split(","))
        args.batch_list = [positive(b) for b in args.batches.split(",")]
    except (ValueError, argparse.ArgumentTypeError):
        ap.error("--batches and --matmul-sizes: give positive integers, comma-separated")
    args.names = [s for s in args.systems.split(",") if s]
    for name in args.names:
        if name not in (*SYSTEMS, "ours-bf16") or args.names.count(name) > 1:
            ap.error(f"--systems: {name!r} is not one of ours-auto, ours-fp32, ours-bf16, ours-int8, hf-fp32, "
                     "once each")
    return args


def multiply_adds(batch: int, prompt: int, new: int, d: int, layers: int, kv_dim: int, ffn: int,
                  vocab: int) -> float:
    """The work itself: the prompt through every layer, each new token but the last through
    every layer (the last is only sampled), an output projection for each new token; attention
    over the positions there are."""
    def layer(t: int) -> int:  # one token at position t (t positions to attend to)
        return d * (d + 2 * kv_dim) + d * d + 3 * d * ffn + 2 * t * d

    tokens = sum(layer(t) for t in range(1, prompt + new))  # the prompt's, then new - 1 fed back
    return batch * (layers * tokens + new * d * vocab)


def main() -> int:
    args = parse()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from transformer.decode import generate
    from transformer.decode.precision import for_inference, resolve_precision
    from transformer.interop import from_llama

    load = [os.getloadavg()[0]]
    rates = [{k: matmul_rate(t, args.sizes) for k, t in (("fp32", torch.float32), ("bf16", torch.bfloat16))}]
    log("building the model")
    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None, eos_token_id=None)
    hf = Qwen2ForCausalLM(config).eval()
    ours_fp32 = from_llama(hf).eval()
    cfg = ours_fp32.cfg
    pad = 0

    def ours(precision: str):
        m = for_inference(ours_fp32, precision)
        return lambda prompts, new: generate(m, prompts, new, temperature=0)

    @torch.inference_mode()
    def hf_generate(prompts, new):
        ids = torch.tensor(prompts)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=pad)
        return out[:, ids.size(1):].tolist()

    systems = {n: hf_generate if n == "hf-fp32" else ours(n[5:]) for n in args.names}
    auto = resolve_precision("auto", "cpu", ours_fp32)  # measured, as for_inference resolves it
    labels = {n: "HF generate() fp32" if n == "hf-fp32" else f"ours --precision {n[5:]}"
              + (f" ({auto})" if n == "ours-auto" else "") for n in args.names}
    gen = torch.Generator().manual_seed(1)
    result = {"machine": hardware.describe(), "params": sum(p.numel() for p in ours_fp32.parameters()),
              "prompt": args.prompt, "new": args.new, "rounds": args.rounds, "threads": args.threads, "rows": []}
    for b in args.batch_list:
        prompts = torch.randint(1, cfg.vocab_size, (b, args.prompt), generator=gen).tolist()
        for n, f in systems.items():  # warm-up, untimed
            f(prompts, 2)
        times = {n: [] for n in systems}
        cpu = {n: [] for n in systems}  # the process's CPU time: what the load does not stretch
        outs = {}
        for r in range(args.rounds):
            for n in args.names[r % len(args.names):] + args.names[: r % len(args.names)]:
                t, c = time.perf_counter(), time.process_time()
                outs[n] = systems[n](prompts, args.new)
                times[n].append(time.perf_counter() - t)
                cpu[n].append(time.process_time() - c)
                log(f"batch {b} round {r + 1}/{args.rounds}: {n} {times[n][-1]:.1f} s ({cpu[n][-1]:.1f} s of CPU)")
            load.append(os.getloadavg()[0])
        work = multiply_adds(b, args.prompt, args.new, cfg.d_model, cfg.n_layers,
                             cfg.d_model // args.heads * args.kv_heads, args.ffn, cfg.vocab_size)
        for n in systems:
            same = None if "ours-fp32" not in outs else sum(x == y for x, y in zip(outs[n], outs["ours-fp32"]))
            result["rows"].append({"batch": b, "system": n, "label": labels[n], "seconds": times[n],
                                   "median_s": statistics.median(times[n]), "cpu_seconds": cpu[n],
                                   "median_cpu_s": statistics.median(cpu[n]), "multiply_adds": work,
                                   "all_new_tokens": all(len(o) == args.new for o in outs[n]),
                                   "same_as_ours_fp32": same})
    rates.append({k: matmul_rate(t, args.sizes) for k, t in (("fp32", torch.float32), ("bf16", torch.bfloat16))})
    peak = {k: max(r[k] for r in rates) for k in rates[0]}
    result.update(load_average=load, matmul_flops=peak)
    print(report(result, args, cfg))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def report(result: dict, args, cfg) -> str:
    peak = result["matmul_flops"]
    lines = [f"Qwen2-0.5B-shaped: {result['params']:,} parameters ({args.layers} layers, hidden {args.hidden}, "
             f"{args.heads} heads / {args.kv_heads} kv, FFN {args.ffn}, vocabulary {args.vocab}, tied), random "
             f"weights; prompt {args.prompt}, {args.new} new tokens, greedy; {args.threads} threads, {args.rounds} "
             f"rounds (medians); torch {torch.__version__}; load average "
             + " ".join(f"{x:.1f}" for x in result["load_average"]) + " (start, after each round)",
             f"matmul rate (benchmarks/matmul_rate.py, sizes {args.matmul_sizes}): fp32 {peak['fp32'] / 1e9:,.0f} "
             f"GFLOP/s, bf16 {peak['bf16'] / 1e9:,.0f} GFLOP/s", "",
             "| batch | system | seconds | rounds, s | new tokens/s | speed x HF | CPU seconds | CPU speed x HF | GMAC/s "
             "| of the fp32 matmul rate | of the bf16 matmul rate | all tokens made | greedy output equal to ours fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    goals = []
    for b in args.batch_list:
        rows = [r for r in result["rows"] if r["batch"] == b]
        hf = next((r["median_s"] for r in rows if r["system"] == "hf-fp32"), None)
        hf_cpu = next((r["median_cpu_s"] for r in rows if r["system"] == "hf-fp32"), None)
        for r in rows:
            rate = r["multiply_adds"] / r["median_s"]
            same = "" if r["same_as_ours_fp32"] is None else f"{r['same_as_ours_fp32']}/{b}"
            speed = "" if hf is None else f"{hf / r['median_s']:.2f}"
            cpu_speed = "" if hf is None else f"{hf_cpu / r['median_cpu_s']:.2f}"
            lines.append(f"| {b} | {r['label']} | {r['median_s']:.1f} | {' '.join(f'{x:.1f}' for x in r['seconds'])} | "
                         f"{b * args.new / r['median_s']:,.1f} | {speed} | {r['median_cpu_s']:.1f} | {cpu_speed} | "
                         f"{rate / 1e9:,.1f} | {2 * rate / peak['fp32']:.0%} | {2 * rate / peak['bf16']:.0%} | "
                         f"{'yes' if r['all_new_tokens'] else 'no'} | {same} |")
        ours = [r for r in rows if r["system"].startswith("ours")]
        if hf is not None and ours:
            best = min(ours, key=lambda r: r["median_s"])
            goals.append(f"batch {b}: ours at its fastest ({best['system']}) is {hf / best['median_s']:.2f}x HF "
                         f"generate()'s speed in wall time, {hf_cpu / best['median_cpu_s']:.2f}x in CPU time "
                         "(goal >= 3x)")
    return "\n".join(lines + [""] + goals)


if __name__ == "__main__":
    sys.exit(main())
