"""Does a live CTranslate2 model slow the torch systems in the same process? Greedy
generation of ours (eager and compiled) and of HF ``generate()``, timed with no CTranslate2
``Generator`` in the process, then with one alive (loaded, and run once), round after round.

    .venv/bin/python benchmarks/lm/neighbour.py [--batch 1] [--new 256] [--rounds 2]

The model is the ``llama-char`` shape with random weights, as in ``generate.py``. This is why
``generate.py`` and ``benchmarks/decode/run.py`` load a CTranslate2 model for its own turn only.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

import torch

from transformer import ModelConfig, compiled, hardware
from transformer.decode import generate
from transformer.interop import save_ctranslate2_lm, to_llama
from transformer.model import LanguageModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-gemm-timing", action="store_true",
                    help="build the compiled step without inductor's GEMM timing (a quicker build; for smoke tests)")
    args = ap.parse_args()
    import ctranslate2

    if args.no_gemm_timing:
        from transformer.compiled import build

        build.INDUCTOR_OPTIONS["max_autotune_gemm"] = False

    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig.preset("llama-char", vocab_size=68, max_len=512)).eval()
    hf = to_llama(model).eval()
    ct2_dir = tempfile.mkdtemp(prefix="ct2-lm.")
    vocab = [f"t{i}" for i in range(68)]
    save_ctranslate2_lm(model, ct2_dir, vocab)
    prompts = torch.randint(3, 68, (args.batch, 16), generator=torch.Generator().manual_seed(1)).tolist()

    @torch.inference_mode()
    def hf_generate():
        ids = torch.tensor(prompts)
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new, min_new_tokens=args.new,
                    do_sample=False, pad_token_id=0)

    systems = {"ours-fp32": lambda: generate(model, prompts, args.new, temperature=0),
               "ours-fp32-compiled": lambda: generate(model, prompts, args.new, temperature=0,
                                                      step=compiled.step(model, 1, False)),
               "hf-fp32": hf_generate}
    for f in systems.values():  # warm-up (and the compilation)
        f()
    times = {(n, alive): [] for n in systems for alive in (False, True)}
    for _ in range(args.rounds):
        for alive in (False, True):
            neighbour = None
            if alive:
                neighbour = ctranslate2.Generator(ct2_dir, device="cpu", intra_threads=args.threads)
                neighbour.generate_batch([[vocab[i] for i in p] for p in prompts], max_length=args.new,
                                         min_length=args.new, sampling_topk=1)
            for name, f in systems.items():
                for _ in range(3):
                    t = time.perf_counter()
                    f()
                    times[name, alive].append(time.perf_counter() - t)
            del neighbour
            gc.collect()
    print(f"batch {args.batch}, {args.new} new tokens, {args.threads} threads; medians of {3 * args.rounds} runs\n")
    print("| system | tokens/s, no CTranslate2 model alive | with one alive | slowdown |")
    print("|---|---|---|---|")
    for name in systems:
        alone, beside = (args.batch * args.new / statistics.median(times[name, a]) for a in (False, True))
        print(f"| {name} | {alone:,.0f} | {beside:,.0f} | {alone / beside:.2f}x |")


if __name__ == "__main__":
    main()
