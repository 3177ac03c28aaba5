"""Generation on an imported checkpoint against Hugging Face ``generate()`` on the same
weights, side by side in one process.

A random Llama-shaped checkpoint (default: SmolLM2-135M's shape: 30 layers, 576 wide, 9
heads, 3 key/value heads, vocabulary 49,152, tied head) is saved with ``save_pretrained``
together with a small byte-level BPE tokenizer, imported with ``transformer import`` (the
command a user runs), and opened with ``Generator.from_pretrained`` at its default settings
(``precision auto``, ``compile auto``), and with its
compiled step built first (``--compile on``; ``auto`` uses it from then on). Both systems continue the same random prompts
greedily for exactly ``--new`` tokens (no early stop); they take turns, medians of
``--rounds``. Greedy tokens are compared with ours in fp32.

    .venv/bin/python benchmarks/interop/import_generate.py [--new 64] [--batches 1,16] [--also int8]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer import hardware

SHAPES = {  # HF LlamaConfig fields
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2048, max_position_embeddings=256, tie_word_embeddings=True),
}


def checkpoint(folder: Path, shape: dict) -> None:
    """A random LlamaForCausalLM of ``shape`` and a byte-level BPE tokenizer, saved as a hub folder is."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog. " * 8, "héllo wörld 你好 🙂\n" * 4],
                            trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>").save_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**shape, bos_token_id=0, eos_token_id=0)).eval().save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    ap.add_argument("--new", type=int, default=64, help="new tokens")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--also", default="", help="more settings of ours to time, PRECISION[:COMPILE] (compile auto unless given; "
                         "on: the step built first), e.g. int8,int8:on")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    from transformers import LlamaForCausalLM

    from transformer.decode import generate
    from transformer.inference.generator import Generator

    tmp = Path(tempfile.mkdtemp(prefix="import-generate."))
    checkpoint(tmp / "hf", SHAPES[args.shape])
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "transformer", "import", str(tmp / "hf"), "--out", str(tmp / "run")],
                   check=True)
    print(f"transformer import: {time.perf_counter() - t:.1f} s", flush=True)
    ours = Generator.from_pretrained(tmp / "run")  # the defaults of `transformer generate`
    ours_fp32 = Generator.from_pretrained(tmp / "run", precision="fp32", compile="off")
    compiled = Generator.from_pretrained(tmp / "run", compile="on")
    t = time.perf_counter()
    compiled.prepare()  # build the compiled step (kept in the user's cache: a later `compile auto` finds it)
    print(f"building the compiled step: {time.perf_counter() - t:.1f} s", flush=True)
    hf = LlamaForCausalLM.from_pretrained(tmp / "hf").eval()
    hf_bf16 = LlamaForCausalLM.from_pretrained(tmp / "hf", dtype=torch.bfloat16).eval()
    d = ours.decoding
    vocab = ours.tokenizer.vocab_size
    gen = torch.Generator().manual_seed(1)

    def mine(g):
        g = g.with_decoding(max_new_tokens=args.new)  # (its front door decides eager or compiled)
        return lambda p: generate(g.model, p, args.new, temperature=0, step=g.search_step(len(p)))

    def theirs(m):
        @torch.inference_mode()
        def run(p):
            ids = torch.tensor(p)
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                             min_new_tokens=args.new, do_sample=False, pad_token_id=0)
            return out[:, ids.size(1):].tolist()
        return run

    def products_alone(model):
        """Only the fp32 matrix products of ``--new`` steps, one token per row: every linear
        layer and the head, nothing else. No fp32 step can be faster; at batch 1 this is the
        time to read the weights once a step."""
        weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
        weights.append(model.output_layer()[0])
        rows = {w.size(1) for w in weights}

        @torch.inference_mode()
        def run(p):
            x = {k: torch.randn(len(p), k) for k in rows}
            for _ in range(args.new):
                for w in weights:
                    torch.nn.functional.linear(x[w.size(1)], w)
        return run

    systems = {f"ours (default: {d.precision}, compile {d.compile})": mine(ours), "ours fp32": mine(ours_fp32),
               f"ours compiled ({compiled.decoding.precision})": mine(compiled),
               "HF fp32": theirs(hf), "HF bf16": theirs(hf_bf16),
               "fp32 matrix products alone (a bound on any fp32 step)": products_alone(ours_fp32.model)}
    for also in filter(None, args.also.split(",")):
        precision, _, when = also.partition(":")
        extra = Generator.from_pretrained(tmp / "run", precision=precision, compile=when or "auto")
        if when == "on":
            extra.prepare()
        systems[f"ours {extra.decoding.precision} (compile {extra.decoding.compile})"] = mine(extra)
    ref_name, hf_name = "ours fp32", "HF fp32"
    params = sum(p.numel() for p in hf.parameters())
    print(f"{args.shape}: {params:,} parameters; prompt {args.prompt}, {args.new} new tokens, greedy; "
          f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds (medians)\n")
    print("| batch | system | new tokens/s | x HF fp32 | greedy tokens equal to ours fp32 |")
    print("|---|---|---|---|---|")
    for b in map(int, args.batches.split(",")):
        p = torch.randint(1, vocab, (b, args.prompt), generator=gen).tolist()
        outs = {n: f(p) for n, f in systems.items()}  # warm-up, and the outputs
        times: dict[str, list[float]] = {n: [] for n in systems}
        for r in range(args.rounds):
            names = list(systems)
            for n in names[r % len(names):] + names[: r % len(names)]:
                t = time.perf_counter()
                systems[n](p)
                times[n].append(time.perf_counter() - t)
        tps = {n: b * args.new / statistics.median(v) for n, v in times.items()}
        for n in systems:
            same = "-" if outs[n] is None else f"{sum(a == c for a, c in zip(outs[n], outs[ref_name]))}/{b}"
            print(f"| {b} | {n} | {tps[n]:,.1f} | {tps[n] / tps[hf_name]:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
