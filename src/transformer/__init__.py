"""A from-scratch Transformer ("Attention Is All You Need", Vaswani et al., 2017)."""
from .config import ModelConfig
from .model import KVCache, Transformer

__version__ = "0.1.0"
__all__ = ["ModelConfig", "Transformer", "KVCache", "__version__"]
