"""Generation speed of the language model, side by side in one process: ours
(``transformer.decode.generate``, greedy, fp32 and bf16), Hugging Face ``generate()`` on the
same weights exported with ``to_llama`` / ``to_gpt2``, and CTranslate2's ``Generator`` on
``save_ctranslate2_lm``'s export (fp32 and int8). Batch 1 and 16, ``--new`` tokens after a
``--prompt``-token prompt, every system forced to generate all of them (no early stop); the
systems take turns, medians of ``--rounds``. Greedy outputs are compared with ours.

    .venv/bin/python benchmarks/lm/generate.py [--run RUN | --preset llama-char --max-len 512] [--new 256]

Without ``--run`` the model has random weights of the preset's shape (speed does not depend
on what it learned); ``--max-len`` gives it room for prompt and continuation.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from turns import its_turn  # noqa: E402

from transformer import ModelConfig, hardware  # noqa: E402
from transformer.decode import generate
from transformer.decode.precision import for_inference
from transformer.model import LanguageModel
from transformer.run import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a trained language-model run (default: random weights of --preset)")
    ap.add_argument("--preset", default="llama-char")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=68)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--new", type=int, default=256, help="new tokens")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    torch.manual_seed(0)
    if args.run:
        model, _ = load_model(args.run)
    else:
        model = LanguageModel(ModelConfig.preset(args.preset, vocab_size=args.vocab, max_len=args.max_len)).eval()
    cfg = model.cfg
    if args.prompt + args.new > cfg.max_len:
        sys.exit(f"--prompt + --new must fit the model's max_len ({cfg.max_len})")
    import ctranslate2

    from transformer.interop import save_ctranslate2_lm, to_gpt2, to_llama

    hf = (to_llama if cfg.positions == "rope" else to_gpt2)(model).eval()
    vocab = [f"t{i}" for i in range(cfg.vocab_size)]
    ct2_dir = tempfile.mkdtemp(prefix="ct2-lm.")
    save_ctranslate2_lm(model, ct2_dir, vocab)
    bf16 = for_inference(model, "bf16")
    gen = torch.Generator().manual_seed(1)

    def prompts(b: int) -> list[list[int]]:
        return torch.randint(3, cfg.vocab_size, (b, args.prompt), generator=gen).tolist()

    def ours(m, compile="off"):
        from transformer import compiled
        from transformer.decode.precision import uses_int8_gemm

        step = compiled.step(m, 1, False) if compile == "on" and not uses_int8_gemm(m) else None
        return lambda p: generate(m, p, args.new, temperature=0, step=step)

    @torch.inference_mode()
    def hf_generate(p):
        ids = torch.tensor(p)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new, min_new_tokens=args.new,
                          do_sample=False, pad_token_id=cfg.pad_id)
        return out[:, ids.size(1):].tolist()

    class ct2_generate:
        """CTranslate2's Generator, loaded only for its own turn (``turns.py``: alive, it
        slows the torch systems in the process)."""

        def __init__(self, q: str):
            self.q, self.generator = q, None

        def open(self):
            self.generator = ctranslate2.Generator(ct2_dir, device="cpu", compute_type=self.q,
                                                   intra_threads=args.threads)

        def close(self):
            self.generator = None
            gc.collect()

        def __call__(self, p):
            res = self.generator.generate_batch([[vocab[i] for i in row] for row in p], max_length=args.new,
                                                min_length=args.new, sampling_topk=1, include_prompt_in_result=False)
            return [r.sequences_ids[0] for r in res]

    def timed(f, p):
        """(seconds, outputs) of ``f(p)``, in the system's turn (:func:`its_turn`)."""
        with its_turn(f):
            t = time.perf_counter()
            out = f(p)
            return time.perf_counter() - t, out

    systems = {"ours-fp32": ours(model), "ours-bf16": ours(bf16), "ours-fp32-compiled": ours(model, "on"),
               "ours-bf16-compiled": ours(bf16, "on"), "hf-fp32": hf_generate,
               "ct2-fp32": ct2_generate("float32"), "ct2-int8": ct2_generate("int8")}
    print(f"{cfg.kind} {cfg.positions} {cfg.n_layers} layers, d_model {cfg.d_model}, {model.num_parameters():,} "
          f"parameters; prompt {args.prompt}, {args.new} new tokens, greedy; torch {torch.__version__}, "
          f"{args.threads} threads, {args.rounds} rounds (medians)\n")
    print("| batch | system | new tokens/s | x HF | greedy tokens equal to ours-fp32 | first call, s |")
    print("|---|---|---|---|---|---|")
    for b in map(int, args.batches.split(",")):
        p = prompts(b)
        times: dict[str, list[float]] = {n: [] for n in systems}
        outs = {}
        warmup = {}
        for n, f in systems.items():  # warm-up (for the compiled step: its compilation), and the outputs
            warmup[n], outs[n] = timed(f, p)
        for r in range(args.rounds):
            names = list(systems)
            for n in names[r % len(names):] + names[: r % len(names)]:
                times[n].append(timed(systems[n], p)[0])
        tps = {n: b * args.new / statistics.median(v) for n, v in times.items()}
        ref = outs["ours-fp32"]
        for n in systems:
            same = sum(a[: len(c)] == c[: len(a)] and len(a) == len(c) for a, c in zip(outs[n], ref))
            print(f"| {b} | {n} | {tps[n]:,.0f} | {tps[n] / tps['hf-fp32']:.2f} | {same}/{b} | {warmup[n]:.1f} |")


if __name__ == "__main__":
    main()
