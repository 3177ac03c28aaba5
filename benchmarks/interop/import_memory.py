"""Peak memory of ``transformer import`` against the size of the checkpoint it reads.

Builds a random checkpoint of Qwen2.5-0.5B's shape (24 layers, d_model 896, 14 heads / 2 K/V
heads, d_ff 4864, vocabulary 151,936, tied head; about 0.49B parameters, bf16) with a small
byte-level BPE tokenizer in a temporary folder, runs ``transformer import`` on it in a child
process, and reports the child's peak resident memory (``getrusage(RUSAGE_CHILDREN)``)
beside the safetensors file's size; then the same for a child that only imports the modules
(the interpreter, torch, transformers), which is the floor under any import.

    .venv/bin/python benchmarks/interop/import_memory.py [--layers 24] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

SHAPE = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
             vocab_size=151936, max_position_embeddings=32768)


def build(folder: Path, layers: int) -> int:
    """A random Qwen2-shaped checkpoint and tokenizer in ``folder``; returns the safetensors size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen2Config(**SHAPE, num_hidden_layers=layers, tie_word_embeddings=True, bos_token_id=0,
                         eos_token_id=0, dtype="bfloat16")
    config.save_pretrained(folder)
    c, kv, ff = SHAPE["hidden_size"], SHAPE["num_key_value_heads"] * 64, SHAPE["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (SHAPE["vocab_size"], c), "model.norm.weight": (c,)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": (c,), f"{p}.post_attention_layernorm.weight": (c,),
                       f"{p}.self_attn.q_proj.weight": (c, c), f"{p}.self_attn.q_proj.bias": (c,),
                       f"{p}.self_attn.k_proj.weight": (kv, c), f"{p}.self_attn.k_proj.bias": (kv,),
                       f"{p}.self_attn.v_proj.weight": (kv, c), f"{p}.self_attn.v_proj.bias": (kv,),
                       f"{p}.self_attn.o_proj.weight": (c, c), f"{p}.mlp.gate_proj.weight": (ff, c),
                       f"{p}.mlp.up_proj.weight": (ff, c), f"{p}.mlp.down_proj.weight": (c, ff)})
    g = torch.Generator().manual_seed(0)
    tensors = {name: (0.02 * torch.randn(shape, generator=g)).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return (folder / "model.safetensors").stat().st_size


def peak_rss_of(argv: list[str]) -> int:
    """The peak resident memory (bytes) of a child process running ``argv``, alone."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *argv], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--keep", help="build the checkpoint and the run here instead of a temporary folder")
    args = parser.parse_args()
    from transformer import hardware

    print(f"machine: {hardware.describe_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        size = build(root / "hf", args.layers)
        command = [sys.executable, "-m", "transformer", "import", str(root / "hf"), "--out", str(root / "run")]
        peak = peak_rss_of(command)
        modules = "import torch, transformers, tokenizers, transformer.interop.hf_import"
        floor = peak_rss_of([sys.executable, "-c", modules])
        result = {"machine": hardware.describe(), "layers": args.layers, "safetensors_bytes": size, "import_peak_rss_bytes": peak,
                  "ratio": round(peak / size, 3), "modules_only_peak_rss_bytes": floor,
                  "run_bytes": (root / "run" / "best.safetensors").stat().st_size}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
