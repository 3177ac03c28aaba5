"""The tiny models and inputs of the inspect tests (a module of its own name: ``conftest`` is
another module in every folder)."""
from __future__ import annotations

import torch

from transformer import ModelConfig, Transformer
from transformer.model.lm import LanguageModel

SRC = torch.tensor([[3, 4, 5, 6, 7, 2], [8, 9, 10, 2, 0, 0]])  # the second row padded
TGT = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 3, 0]])
TOKENS = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 0, 9, 10, 11, 12]])  # the second row left-padded

# the translation model's variants (as the model tests' conftest has them)
VARIANTS = {
    "post-norm": {},
    "pre-norm": dict(norm_first=True),
    "swiglu": dict(ffn_activation="swiglu"),
    "untied": dict(tie_embeddings=False, tgt_vocab_size=11, output_bias=True),
    "concat-gelu": dict(sinusoid_layout="concat", ffn_activation="gelu"),
}

LM_VARIANTS = {
    "gpt2": dict(preset="gpt2-small"),
    "llama-gqa": dict(preset="llama-300m", n_kv_heads=2),
    "qwen2-bias": dict(preset="llama-300m", n_kv_heads=4, qkv_bias=True),
    "sinusoidal-post-norm": dict(preset="tiny", kind="decoder-only"),
}


def _nudged(model):
    """Biases and norm parameters made non-trivial (a test cannot pass because they are 0 or 1)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def build_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    sizes = dict(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=64)
    return _nudged(Transformer(ModelConfig(**{**sizes, **overrides})))


def tiny_lm(seed: int = 0, preset: str = "gpt2-small", **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    sizes = dict(vocab_size=17, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_len=32, dropout=0.0, bos_id=1, eos_id=2)
    return _nudged(LanguageModel(ModelConfig.preset(preset, **{**sizes, **overrides})))
