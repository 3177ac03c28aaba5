"""The Transformer: masks, embeddings, attention, layers, KV cache and the full model."""
from .attention import MultiHeadAttention, attention
from .cache import KVCache
from .transformer import Decoder, Encoder, Transformer

__all__ = ["attention", "MultiHeadAttention", "KVCache", "Encoder", "Decoder", "Transformer"]
