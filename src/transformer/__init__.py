"""A from-scratch Transformer ("Attention Is All You Need", Vaswani et al., 2017).

    from transformer import Translator, Generator
    Translator.from_pretrained("runs/demo").translate(["A dog runs."])
    Generator.from_pretrained("runs/shakespeare").generate(["ROMEO:"])

The names below are imported on first use (PEP 562), so ``import transformer`` (and
``transformer --version``) does not load torch; ``from transformer import Translator``
loads what translation needs and nothing optional (no fastapi, no transformers).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

__version__ = "0.1.0"  # the one place it is written: pyproject.toml reads it from here

# public name -> the module that defines it
_LAZY = {
    "ModelConfig": ".model.config",
    "Transformer": ".model",
    "KVCache": ".model",
    "LanguageModel": ".model",
    "Translator": ".inference.translator",
    "Generator": ".inference.generator",
}
__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .model.config import ModelConfig
    from .inference.generator import Generator
    from .model import KVCache, LanguageModel, Transformer
    from .inference.translator import Translator


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
