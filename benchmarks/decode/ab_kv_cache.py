"""What the eager step's in-place KV cache (``decode/fixed_cache.py``) buys, in one process: the
same Translator decoding the same sentences on it (``now``) and on the model's growing KVCache
(``before``: K, V concatenated every step, beams reordered into new tensors), taking turns,
round after round, each timed in the process's CPU time, 1 thread. First, the parts alone
(:func:`cache_step_costs`).

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/ab_kv_cache.py \\
        --work DIR [--n 32] [--rounds 3] [--precision fp32] [--beam 4] [--length 63]

``--work`` is ``real_size.py``'s folder (its ``run/`` is decoded, read only), or ``--run`` any
translation run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def cache_step_costs(rows: int, heads: int, d_head: int, length: int, dtype, repeats: int = 10) -> dict:
    """CPU ms of one beam step's cache work on one K (rows, heads, ``length`` positions, d_head),
    and of the readable attention's Q K^T product (bf16's path on a CPU) on such a K:

        before       the new position concatenated, then the beams' rows selected (two new tensors)
        now          the rows selected and the new position written into a preallocated buffer,
                     as a contiguous (rows, heads, length + 1, d_head) (decode/fixed_cache.py)
        qk-dense     Q K^T on a contiguous K
        qk-prefix    Q K^T on the first ``length`` slots of a (rows, heads, 2 * length, d_head)
                     buffer: the layout rejected, oneDNN copies such a K (transposed) first"""
    past = torch.randn(rows, heads, length, d_head).to(dtype)
    new = torch.randn(rows, heads, 1, d_head).to(dtype)
    index = torch.randint(0, rows, (rows,))
    flat = torch.empty(rows * heads * (length + 1) * d_head, dtype=dtype)
    prefix = torch.randn(rows, heads, 2 * length, d_head).to(dtype)[:, :, :length]
    q = torch.randn(rows, heads, 1, d_head).to(dtype)

    def now():
        dst = flat.view(rows, heads, length + 1, d_head)
        torch.index_select(past, 0, index, out=dst[:, :, :length])
        dst[:, :, length:] = new

    variants = {"before": lambda: torch.cat([past, new], 2).index_select(0, index), "now": now,
                "qk-dense": lambda: q @ past.transpose(-2, -1), "qk-prefix": lambda: q @ prefix.transpose(-2, -1)}
    out = {}
    for name, fn in [*variants.items()] * 2:  # the second turn counts
        fn()
        start = time.process_time()
        for _ in range(repeats):
            fn()
        out[name] = (time.process_time() - start) / repeats * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="real_size.py's --work folder")
    ap.add_argument("--run", help="a translation run (instead of --work)")
    ap.add_argument("--n", type=int, default=32, help="test_2016_flickr sentences")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", default="fp32", help="fp32, bf16, auto, int8")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--length", type=int, default=62, help="positions cached when timing the parts alone")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformer import hardware
    from transformer.data.corpus import read_lines
    from transformer.data.registry import multi30k_path
    from transformer.decode.eager_step import EagerStep
    from transformer.inference.translator import load_translator
    from transformer.run.layout import read_run_config

    print(hardware.describe_line(), flush=True)
    run = Path(args.run) if args.run else Path(args.work) / "run"
    lang = read_run_config(run).get("src_lang", "en")
    lines = read_lines(multi30k_path("test_2016_flickr", lang, download=False))[: args.n]
    translator = load_translator(run, warn=False, beam=args.beam, precision=args.precision, compile="off")
    model = translator.model
    attn = model.decoder.layers[0].self_attn
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    parts = cache_step_costs(args.n * args.beam, attn.n_kv_heads, attn.d_head, args.length, dtype)
    print(f"one K of {args.n * args.beam} rows x {args.length} positions ({dtype}): "
          + ", ".join(f"{k} {v:.2f} CPU ms" for k, v in parts.items()), flush=True)

    start_now = EagerStep.start

    def translate(name: str) -> list[str]:
        if name == "before":  # the model's own KVCache, grown by concatenation
            EagerStep.start = lambda self, cache, need: cache  # noqa: ARG005
        try:
            return [(h[0].tokens, h[0].score) for h in translator.translate_nbest(lines, 1)]
        finally:
            EagerStep.start = start_now

    names = ["now", "before"]
    cpu = {k: [] for k in names}
    outputs = {}
    for r in range(args.rounds):
        for name in names[r % 2:] + names[: r % 2]:
            start = time.process_time()
            outputs[name] = translate(name)
            cpu[name].append(time.process_time() - start)
            print(f"round {r + 1}: {name} {cpu[name][-1]:.2f} CPU s", flush=True)
    same = sum(a == b for a, b in zip(outputs["now"], outputs["before"]))
    result = {"machine": hardware.describe(), "sentences": len(lines), "precision": args.precision, "beam": args.beam,
              "one_k_cpu_ms": parts, "best_cpu_s": {k: min(v) for k, v in cpu.items()}, "cpu_s": cpu,
              "same_tokens": same}
    best = {k: min(v) for k, v in cpu.items()}
    print(f"{len(lines)} sentences, beam {args.beam}, {args.precision}, 1 thread, best of {args.rounds} (CPU s): "
          f"now {best['now']:.2f}, before {best['before']:.2f} ({best['now'] / best['before']:.3f}x); "
          f"the same tokens and scores on {same}/{len(lines)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
