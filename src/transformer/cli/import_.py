"""``transformer import``: a Hugging Face model (a local folder, or a hub id) as a run directory
that every command reads: generate, evaluate, info, attention, explain, serve, export.
(The module is ``import_`` because ``import`` is a Python keyword; the command is ``import``.)"""
from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import", help="make a run directory of a Hugging Face model (GPT-2, Llama, Mistral, Qwen2, Marian)",
        description="Convert a Hugging Face checkpoint with its tokenizer into a run directory: our weights "
                    "(best.safetensors), config.yaml (decoding defaults from generation_config.json), the "
                    "tokenizer files and import.json. Weights are converted one tensor at a time. Needs the "
                    "interop extra (transformers, tokenizers, huggingface_hub): pip install '.[interop]' (in the "
                    "project's folder).")
    p.add_argument("source", metavar="SOURCE",
                   help="a Hugging Face model folder (config.json, weights, tokenizer), or a hub id owner/name "
                        "(downloaded with huggingface_hub where the machine has network)")
    p.add_argument("--out", required=True, help="the new run directory (must not exist, or be empty)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..interop.hf_import import import_pretrained
    from ._options import new_directory

    new_directory(args.out)
    done = import_pretrained(args.source, args.out)
    if done.cfg is None:
        print(f"imported {done.family} ({args.source}) -> {done.run}")
        print(_compile_hint("translate", done.run))
        return 0
    for note in done.notes:
        print(f"warning: {note}", file=sys.stderr, flush=True)
    c = done.cfg
    head = "tied head" if c.tie_embeddings else "untied head"
    print(f"imported {done.family} ({done.parameters / 1e6:.1f}M parameters: {c.n_layers} layers, d_model {c.d_model}, "
          f"{c.n_heads} heads / {c.kv_heads} kv, vocabulary {c.vocab_size}, {head}) -> {done.run} "
          f"(best.safetensors, {done.tokenizer}, config.yaml)")
    print(_compile_hint("generate", done.run))
    return 0


def _compile_hint(command: str, run) -> str:
    """How to get the compiled decoding step, which ``--compile auto`` uses once it is built
    but does not build for a short job (what the speed measured for imported models is)."""
    return (f"decodes eagerly until its compiled step is built: 'transformer {command} --model {run} --compile on' "
            f"builds it once for this CPU (a few minutes; kept in your cache, then used by default)")
