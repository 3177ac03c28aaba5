"""How inductor's options change the compiled decoding step: greedy generation through
``transformer.compiled`` with the ``INDUCTOR_OPTIONS`` of ``compiled/build.py`` (``current``) against
variants of them, and eager, in one process. Each system is a copy of the same model,
compiled with its own options on its first call (timed apart); then the systems take turns,
round after round.

    .venv/bin/python benchmarks/lm/inductor_options.py [--precision bf16] [--batch 16] \\
        [--variant NAME:OPTION=VALUE[,OPTION=VALUE...]] ... [--rounds 5]

A variant's options replace or extend the current ones, e.g. ``--variant
no-template:max_autotune_gemm=False`` (the step before the C++ GEMM template) or ``--variant
no-prepack:cpp.weight_prepack=False``. Values are Python literals. The model is the
``llama-char`` shape with random weights, as in ``generate.py``.
"""
from __future__ import annotations

import argparse
import ast
import copy
import statistics
import time

import torch

import transformer.compiled.build as aot
from transformer import ModelConfig, compiled, hardware
from transformer.decode import generate
from transformer.model import LanguageModel


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:OPTION=VALUE,...`` -> (NAME, the current options updated with these)."""
    name, _, rest = text.partition(":")
    items = [item for item in rest.split(",") if item]
    if not name or not items or not all("=" in item for item in items):
        raise SystemExit(f"inductor_options.py: error: --variant {text!r}: expected NAME:OPTION=VALUE[,...]")
    options = dict(aot.INDUCTOR_OPTIONS)
    for item in items:
        key, _, value = item.partition("=")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()  # a bare word: a string option
    return name, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--preset", default="llama-char")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--new", type=int, default=256, help="new tokens")
    ap.add_argument("--variant", action="append", default=[], help="NAME:OPTION=VALUE[,...]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    base = LanguageModel(ModelConfig.preset(args.preset, vocab_size=68, max_len=512)).eval().to(dtype)
    prompts = torch.randint(1, 68, (args.batch, args.prompt)).tolist()
    current = dict(aot.INDUCTOR_OPTIONS)
    systems = {"eager": (current, "off"), "current": (current, "on")}
    for text in args.variant:
        name, options = parse_variant(text)
        systems[name] = (options, "on")
    models = {name: copy.deepcopy(base) for name in systems}

    def run(name: str) -> list[list[int]]:
        aot.INDUCTOR_OPTIONS = systems[name][0]  # read when the model's step is named and built
        try:
            step = compiled.step(models[name], 1, False) if systems[name][1] == "on" else None
            return generate(models[name], prompts, args.new, temperature=0, step=step)
        finally:
            aot.INDUCTOR_OPTIONS = current

    print(f"{args.preset}, {args.precision}, batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, "
          f"greedy; torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds (medians)\n")
    tokens, first, times = {}, {}, {name: [] for name in systems}
    for name in systems:
        t = time.perf_counter()
        tokens[name] = run(name)
        first[name] = time.perf_counter() - t
    for r in range(args.rounds):
        order = list(systems)[r % len(systems):] + list(systems)[:r % len(systems)]
        for name in order:
            t = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - t)
    ref = statistics.median(times["current"])
    print("| system | s per generation | x current | tokens equal to eager | first call, s |")
    print("|---|---|---|---|---|")
    for name in systems:
        med = statistics.median(times[name])
        same = sum(a == b for a, b in zip(tokens[name], tokens["eager"]))
        print(f"| {name} | {med:.3f} | {ref / med:.2f} | {same}/{args.batch} | {first[name]:.1f} |")


if __name__ == "__main__":
    main()
