"""Model configuration: one frozen dataclass with the paper's names, validated once.

Presets:
    base   the paper's base model (N=6, d_model=512, d_ff=2048, h=8, dropout 0.1)
    big    the paper's big model  (N=6, d_model=1024, d_ff=4096, h=16, dropout 0.3)
    small  a CPU-sized model for Multi30k (4+4 layers, d_model 256)
    tiny   the published Multi30k text-only setting (4+4, d_model 128, d_ff 256, 4 heads)
    toy    a very small model for synthetic tasks and tests

Decoder-only language models (``kind="decoder-only"``):
    nanogpt-char  nanoGPT's CPU Shakespeare shape (4 layers, 4 heads, 128 wide, context 64)
    llama-char    the same size, Llama-style (RMSNorm, SwiGLU, rotary positions, no biases)
    gpt2-small    GPT-2 small's shape (124M parameters with its 50,257-token vocabulary)
    llama-300m    a Llama of about 300M parameters (grouped-query attention, 32k vocabulary)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import shown
from ..frozen import TYPE_NAMES, Frozen, has_type, known_keys, whole_numbers_as_floats

FFN_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu")
SINUSOID_LAYOUTS = ("interleaved", "concat")
KINDS = ("encoder-decoder", "decoder-only")
NORMS = ("layer", "rms")
POSITIONS = ("sinusoidal", "learned", "rope")


@dataclass(frozen=True)
class ModelConfig(Frozen):
    """Everything needed to build a :class:`~transformer.Transformer`.

    The token ids ``pad_id``, ``bos_id`` and ``eos_id`` belong here because the model
    builds its padding masks from ``pad_id`` and decoding starts from ``bos_id``.
    """

    vocab_size: int  # tokens in the (source) vocabulary; training sets it from its tokenizer
    kind: str = "encoder-decoder"  # the paper's translation model, or "decoder-only" (a GPT / Llama language model)
    d_model: int = 512  # the width of every sub-layer's input and output (d_model)
    n_heads: int = 8  # attention heads (h); each is d_model / n_heads wide (d_k = d_v)
    d_ff: int = 2048  # the inner width of each position-wise feed-forward network (d_ff)
    n_layers: int = 6  # encoder layers and decoder layers (N in the paper)
    n_kv_heads: int | None = None  # grouped-query attention: K/V heads shared by n_heads / n_kv_heads queries; None = n_heads
    dropout: float = 0.1  # P_drop: sub-layer outputs and embedding + position sums
    attn_dropout: float = 0.0  # on the attention weights (0 in the paper)
    max_len: int = 1024  # longest sequence the positional table covers
    tgt_vocab_size: int | None = None  # None: one vocabulary shared by source and target
    tie_embeddings: bool = True  # share source, target and output weights (needs a shared vocabulary)
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    final_norm: bool | None = None  # LayerNorm after each stack; None: only with pre-norm
    ffn_activation: str = "relu"  # relu (paper), gelu, gelu_tanh (GPT-2), silu, or swiglu (gated, 3 matrices)
    norm: str = "layer"  # LayerNorm (paper, GPT) or "rms": RMSNorm (Llama)
    bias: bool = True  # biases in the attention and FFN matrices and the norms (Llama and nanoGPT: none)
    qkv_bias: bool = False  # biases on the query, key and value projections even when bias is off (Qwen2)
    positions: str = "sinusoidal"  # the paper's sinusoids, "learned" (GPT-2) or "rope": rotary (Llama)
    rope_theta: float = 10000.0  # the rotary base frequency
    rope_scaling: dict[str, float] | None = None  # Llama 3's rotary frequency scaling (model/rotary.py); None: unscaled
    embed_scale: bool = True  # multiply embeddings by sqrt(d_model) (paper section 3.4; GPT and Llama do not)
    sinusoid_layout: str = "interleaved"  # paper: sin on even dims, cos on odd; concat: [sin | cos]
    output_bias: bool = False  # a bias on the vocabulary projection (Marian has one)
    layer_norm_eps: float = 1e-5  # added to the variance in each LayerNorm / RMSNorm
    pad_id: int = 0  # the padding token's id (training's tokenizers use 0)
    bos_id: int = 1  # the begin-of-sentence token's id, where decoding starts (training's tokenizers use 1)
    eos_id: int = 2  # the end-of-sentence token's id, which ends an output (training's tokenizers use 2)

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"ModelConfig: {msg}")

        whole_numbers_as_floats(self)  # YAML and JSON give 1 for 1.0
        for f in dataclasses.fields(self):  # before the checks below compare or divide them
            value = getattr(self, f.name)
            need(has_type(value, f.type), f"{f.name} must be {TYPE_NAMES.get(f.type, f.type)}, got {shown(value)}")
        need(self.vocab_size > 0, f"vocab_size must be positive, got {self.vocab_size}")
        need(self.d_model > 0 and self.n_heads > 0, "d_model and n_heads must be positive")
        need(self.d_model % self.n_heads == 0,
             f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        need(self.d_ff > 0 and self.n_layers > 0, "d_ff and n_layers must be positive")
        need(self.kind in KINDS, f"kind must be one of {KINDS}, got {shown(self.kind)}")
        need(self.norm in NORMS, f"norm must be one of {NORMS}, got {shown(self.norm)}")
        need(self.positions in POSITIONS, f"positions must be one of {POSITIONS}, got {shown(self.positions)}")
        if self.n_kv_heads is not None:
            need(0 < self.n_kv_heads <= self.n_heads and self.n_heads % self.n_kv_heads == 0,
                 f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        need(self.positions != "rope" or self.d_head % 2 == 0, "rotary positions need an even head size")
        if self.rope_scaling is not None:
            need(self.positions == "rope", "rope_scaling needs positions='rope'")
            keys = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
            need(set(self.rope_scaling) == keys, f"rope_scaling needs exactly the keys {sorted(keys)}")
            need(self.rope_scaling["high_freq_factor"] > self.rope_scaling["low_freq_factor"],
                 "rope_scaling: high_freq_factor must exceed low_freq_factor")
        need(self.kind == "decoder-only" or self.positions == "sinusoidal",
             "the encoder-decoder model uses sinusoidal positions (learned and rope are for decoder-only models)")
        need(0.0 <= self.dropout < 1.0 and 0.0 <= self.attn_dropout < 1.0, "dropout must be in [0, 1)")
        need(self.max_len > 1, "max_len must be > 1")
        need(self.ffn_activation in FFN_ACTIVATIONS,
             f"ffn_activation must be one of {FFN_ACTIVATIONS}, got {shown(self.ffn_activation)}")
        need(self.sinusoid_layout in SINUSOID_LAYOUTS,
             f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}, got {shown(self.sinusoid_layout)}")
        need(self.sinusoid_layout == "concat" or self.d_model % 2 == 0, "d_model must be even")
        if self.tgt_vocab_size is not None:
            need(self.tgt_vocab_size > 0, "tgt_vocab_size must be positive")
            need(not self.tie_embeddings or self.tgt_vocab_size == self.vocab_size,
                 "tie_embeddings needs one shared vocabulary (tgt_vocab_size None or equal to vocab_size)")
        for name in ("pad_id", "bos_id", "eos_id"):
            v = getattr(self, name)
            need(0 <= v < min(self.vocab_size, self.target_vocab_size),
                 f"{name}={v} is outside the vocabulary")
        need(self.pad_id != self.eos_id,
             "pad_id and eos_id must differ (decoding never generates PAD, so it could never stop)")

    @property
    def d_head(self) -> int:
        """d_k = d_v = d_model / h."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def use_final_norm(self) -> bool:
        return self.norm_first if self.final_norm is None else self.final_norm

    @property
    def decoder_only(self) -> bool:
        return self.kind == "decoder-only"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        if d.get("output_vocab_size", "absent") is None:  # written by versions that had restrict_output
            del d["output_vocab_size"]
        if "output_vocab_size" in d:
            raise ValueError("ModelConfig: output_vocab_size (restrict_output) is no longer supported; "
                             "retrain without restrict_output")
        return cls(**known_keys(cls, d, "ModelConfig: unknown keys {unknown}"))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        """A named preset with keyword overrides, e.g. ``preset("base", vocab_size=37000)``."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {shown(name)}; choose one of {sorted(PRESETS)}")
        kwargs = {**PRESETS[name], **overrides}
        if "vocab_size" not in kwargs:
            raise ValueError("preset(): vocab_size is required")
        return cls(**kwargs)


PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_layers=4, dropout=0.1, max_len=256),
    "tiny": dict(d_model=128, n_heads=4, d_ff=256, n_layers=4, dropout=0.3, max_len=256),
    "toy": dict(d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.0, max_len=128),
}

# Decoder-only language models: the two families of the article's opening note.
_GPT = dict(kind="decoder-only", norm="layer", norm_first=True, final_norm=True, positions="learned",
            embed_scale=False, tie_embeddings=True)
_LLAMA = dict(kind="decoder-only", norm="rms", norm_first=True, final_norm=True, positions="rope", bias=False,
              ffn_activation="swiglu", embed_scale=False, tie_embeddings=False, layer_norm_eps=1e-5)
PRESETS.update({
    # nanoGPT's CPU Shakespeare recipe: 4 layers, 4 heads, 128 wide, context 64, no biases, GELU
    "nanogpt-char": dict(_GPT, d_model=128, n_heads=4, d_ff=512, n_layers=4, max_len=64, dropout=0.0,
                         bias=False, ffn_activation="gelu"),
    # a Llama-style model of about the same size (SwiGLU's three matrices at 2/3 of 4 x 128, rounded up)
    "llama-char": dict(_LLAMA, d_model=128, n_heads=4, d_ff=352, n_layers=4, max_len=64, dropout=0.0),
    # shapes only (recipes to scale to; parameter counts checked by tests/model/test_lm_presets.py)
    "gpt2-small": dict(_GPT, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024, dropout=0.1,
                       ffn_activation="gelu_tanh"),
    "llama-300m": dict(_LLAMA, d_model=1024, n_heads=16, n_kv_heads=8, d_ff=2816, n_layers=20, max_len=2048,
                       dropout=0.0, rope_theta=500000.0),
})
