"""Peak memory of ``transformer import`` against the size of the checkpoint it reads.

Builds a random checkpoint in a temporary folder, runs ``transformer import`` on it in a child
process, and reports the child's peak resident memory (``getrusage(RUSAGE_CHILDREN)``)
beside the safetensors file's size; then the same for a child that only imports the modules
(the interpreter, torch, transformers, the import's own), which is the floor under any import.

``--model qwen2`` (the default): Qwen2.5-0.5B's shape (24 layers, d_model 896, 14 heads / 2
K/V heads, d_ff 4864, vocabulary 151,936, tied head; about 0.49B parameters, bf16) with a
small byte-level BPE tokenizer. ``--model marian``: Helsinki-NLP/opus-mt-en-de's shape (6 + 6
layers, d_model 512, 8 heads, d_ff 2048, one vocabulary of 58,101 for both sides, tied
embeddings; 74M parameters, fp32) saved by ``MarianMTModel.save_pretrained``, with two
sentencepiece models trained here on a small synthetic text and a vocab.json that numbers
their pieces (``<pad>`` at 58,100, as OPUS-MT has it).

    .venv/bin/python benchmarks/interop/import_memory.py [--model qwen2|marian] [--layers N] [--keep DIR]
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


MARIAN_SHAPE = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                    max_position_embeddings=512)


def build_marian(folder: Path, layers: int) -> int:
    """A random opus-mt-en-de-shaped Marian folder (module docstring); returns the safetensors size."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    work = folder.parent / "spm"
    folder.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    words = "the a dog cat runs sleeps over under field house river green small old".split()
    rng = torch.Generator().manual_seed(0)
    text = [" ".join(words[i] for i in torch.randint(len(words), (12,), generator=rng).tolist()) for _ in range(300)]
    for side in ("source", "target"):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(work / side), vocab_size=60,
                                       hard_vocab_limit=False, character_coverage=1.0, minloglevel=2, num_threads=1)
    pad = MARIAN_SHAPE["vocab_size"] - 1
    vocab = {"</s>": 0, "<unk>": 1}
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(work / f"{side}.model"))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = pad
    (work / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    MarianTokenizer(str(work / "source.model"), str(work / "target.model"), str(work / "vocab.json"),
                    source_lang="en", target_lang="de").save_pretrained(folder)
    shape = {**MARIAN_SHAPE, "encoder_layers": layers, "decoder_layers": layers}
    config = MarianConfig(**shape, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                          activation_function="swish", scale_embedding=True, pad_token_id=pad,
                          decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0)
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(folder)  # fp32, as OPUS-MT ships
    return (folder / "model.safetensors").stat().st_size


def peak_rss_of(argv: list[str]) -> int:
    """The peak resident memory (bytes) of a child process running ``argv``, alone."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *argv], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["qwen2", "marian"], default="qwen2")
    parser.add_argument("--layers", type=int, help="layers (of each stack for marian); default: the model's, 24 or 6")
    parser.add_argument("--keep", help="build the checkpoint and the run here instead of a temporary folder")
    args = parser.parse_args()
    from transformer import hardware

    print(f"machine: {hardware.describe_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        layers = args.layers or (6 if args.model == "marian" else 24)
        size = (build_marian if args.model == "marian" else build)(root / "hf", layers)
        command = [sys.executable, "-m", "transformer", "import", str(root / "hf"), "--out", str(root / "run")]
        peak = peak_rss_of(command)
        modules = "import torch, transformers, tokenizers, transformer.interop.hf_import" + (
            ", transformer.interop.marian_run" if args.model == "marian" else "")
        floor = peak_rss_of([sys.executable, "-c", modules])
        result = {"machine": hardware.describe(), "model": args.model, "layers": layers,
                  "safetensors_bytes": size, "import_peak_rss_bytes": peak,
                  "ratio": round(peak / size, 3), "modules_only_peak_rss_bytes": floor,
                  "run_bytes": (root / "run" / "best.safetensors").stat().st_size}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
