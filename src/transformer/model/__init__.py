"""The Transformer: masks, embeddings, attention, layers, KV cache and the full model."""
from .attention import MultiHeadAttention, attention
from .cache import KVCache
from .lm import LanguageModel
from .transformer import Decoder, Encoder, Transformer

__all__ = ["attention", "MultiHeadAttention", "KVCache", "Encoder", "Decoder", "Transformer", "LanguageModel",
           "build_model"]


def build_model(cfg):
    """The model a config describes: :class:`Transformer` or :class:`LanguageModel`."""
    return LanguageModel(cfg) if cfg.decoder_only else Transformer(cfg)
