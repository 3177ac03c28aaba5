"""Tiny Hugging Face checkpoints built in the test, as ``save_pretrained`` writes them: random
weights and a byte-level BPE tokenizer trained on a few lines (or a sentencepiece model for
Llama 2), for ``transformer import`` to read. Nothing is downloaded.

    folder, hf_model = build_checkpoint("qwen2", tmp_path / "hf")

:func:`randomize` and :func:`randomize_marian` draw a model's weights from our own generator
(also for the parity tests, lm_parity.py and test_marian_*.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

# spaces, newlines, tabs, accents, CJK and emoji (4-byte UTF-8: split across byte-level tokens)
TEXT = "Hello world, héllo wörld! 你好世界 🙂🚀\n  two  spaces\tand tabs. Ça va? naïve café\n"
CORPUS = [TEXT * 3, "the quick brown fox jumps over the lazy dog. " * 4, "Ünïcödé ñ 日本語 😀 done\n"] * 4
PROMPT = "Hello world, the quick"

FAMILIES = ["gpt2", "llama3", "llama2-sp", "qwen2", "mistral"]
# special tokens of each family's tokenizer, ids 0, 1, 2 ...: (tokens, bos, eos, BOS added when encoding)
SPECIALS = {
    "gpt2": (["<|endoftext|>"], "<|endoftext|>", "<|endoftext|>", False),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|endoftext|>", False),
    "llama3": (["<unk>", "<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>", "<|end_of_text|>", True),
    "mistral": (["<unk>", "<s>", "</s>"], "<s>", "</s>", True),
}
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}


def byte_level_tokenizer(family: str):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on :data:`CORPUS` (Llama 3's
    adds BOS in its post-processor, as the real one does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials, bos, eos, add_bos = SPECIALS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)


def sentencepiece_tokenizer(folder: Path) -> int:
    """Llama 2's kind of tokenizer: a sentencepiece BPE ``tokenizer.model`` (unk 0, bos 1,
    eos 2, byte fallback) and its tokenizer_config.json; returns the vocabulary size."""
    import io
    import json

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter("".join(CORPUS).splitlines()), model_writer=model,
                                   model_type="bpe", vocab_size=400, hard_vocab_limit=False, byte_fallback=True,
                                   character_coverage=1.0,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
                                   remove_extra_whitespaces=False, normalization_rule_name="identity",
                                   minloglevel=2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer", "legacy": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return sp.get_piece_size()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Weights from our own generator, far from HF's init (whose tiny values make every model
    alike): norm gains near 1 (LayerNorm / RMSNorm, ours and HF's: "norm" or GPT-2's ".ln_"
    in the name), everything else N(0, std)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        is_norm = p.dim() == 1 and ("norm" in name or ".ln_" in name) and name.endswith("weight")
        p.copy_(1 + 0.2 * noise if is_norm else std * noise)


@torch.no_grad()
def randomize_marian(hf: torch.nn.Module, seed: int = 0, std: float = 0.1) -> None:
    """A ``MarianMTModel``'s weights from our own generator, so the model does not depend on
    how a transformers version initialises (or orders) them: LayerNorm gains near 1 and
    biases near 0, everything else N(0, std), ``final_logits_bias`` N(0, 0.5); the
    sinusoidal position table is kept."""
    g = torch.Generator().manual_seed(seed)
    for name, p in hf.named_parameters():
        if "embed_positions" in name:
            continue
        noise = torch.randn(p.shape, generator=g)
        if "layer_norm" in name:
            p.copy_(1 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
        else:
            p.copy_(std * noise)
    hf.final_logits_bias.copy_(0.5 * torch.randn(hf.final_logits_bias.shape, generator=g))


def build_checkpoint(family: str, folder: Path, **overrides):
    """Save a tiny random ``family`` model with its tokenizer into ``folder``: GPT-2 (tied),
    Llama 3 (llama3 rope scaling, GQA, untied), Llama 2 (sentencepiece, tied), Qwen2 (q/k/v
    biases, tied, vocabulary padded by 8 rows) or Mistral (no sliding window, GQA, untied).
    Returns (folder, the HF model in eval mode)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, \
        MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    if family == "llama2-sp":
        vocab = sentencepiece_tokenizer(folder)
        config = LlamaConfig(vocab_size=vocab, **SIZES, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                             **overrides)
        model = LlamaForCausalLM(config)
    else:
        tokenizer = byte_level_tokenizer(family)
        vocab = len(tokenizer)
        ids = dict(bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else None,
                   eos_token_id=tokenizer.eos_token_id)
        if family == "gpt2":
            config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, **ids, **overrides)
            model = GPT2LMHeadModel(config)
        elif family == "llama3":
            config = LlamaConfig(vocab_size=vocab, **SIZES, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False,
                                 **ids, **overrides)
            model = LlamaForCausalLM(config)
        elif family == "qwen2":
            config = Qwen2Config(vocab_size=vocab + 8, **SIZES, tie_word_embeddings=True, **ids, **overrides)
            model = Qwen2ForCausalLM(config)
        else:
            config = MistralConfig(vocab_size=vocab, **{**SIZES, "sliding_window": None, **overrides},
                                   tie_word_embeddings=False, **ids)
            model = MistralForCausalLM(config)
        tokenizer.save_pretrained(folder)
    randomize(model)
    model.eval()
    hf_logging.disable_progress_bar()  # "Writing model shards" on stderr
    model.save_pretrained(folder)
    return folder, model


def copy_folder(folder: Path, to: Path) -> Path:
    """A copy of ``folder`` at ``to`` (links copied as links), for a test to change."""
    import shutil

    shutil.copytree(folder, to, symlinks=True)
    return to


def refused_import(source: Path, out: Path, capsys, *words: str) -> str:
    """``transformer import SOURCE --out OUT`` refused: exit 2, one line on stderr that says
    each of ``words``, and no run (nor its temporary folder) left behind. Returns the line."""
    from transformer.cli import main

    capsys.readouterr()
    assert main(["import", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("transformer import: error:"), err
    for word in words:
        assert word in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temporary folder
    return err
