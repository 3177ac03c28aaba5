"""Tiny random models and inputs for the export tests (imported by the test modules)."""
from __future__ import annotations

import torch

from transformer import ModelConfig, Transformer

V = 40
VOCAB = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, V)]

# Every option an exporter must carry over.
VARIANTS = {
    "post-norm-interleaved": {},
    "concat-silu": dict(sinusoid_layout="concat", ffn_activation="silu"),
    "pre-norm": dict(norm_first=True),
    "pre-norm-no-final-norm": dict(norm_first=True, final_norm=False),
    "swiglu": dict(ffn_activation="swiglu"),
    "untied-bias-gelu": dict(tie_embeddings=False, output_bias=True, ffn_activation="gelu"),
    "eps-1e-6": dict(layer_norm_eps=1e-6),
}


def random_model(seed: int = 0, **overrides) -> Transformer:
    """A tiny eval-mode model whose every parameter (biases, norms, output bias) matters."""
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64)
    model = Transformer(ModelConfig(**{**cfg, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if model.out_bias is not None:
            model.out_bias.normal_()
    return model


def random_sources(lengths=(5, 9, 3, 12), seed: int = 1) -> list[list[int]]:
    """Real-token ids (no specials, no EOS) of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=g).tolist() for n in lengths]
