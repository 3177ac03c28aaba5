"""The optional parts of the package and the one check that their packages are installed.

Translation and training need only the core dependencies. The rest comes with an extra
(``pip install '.[serve]'`` in the project's folder), listed in pyproject.toml:

    serve        fastapi, uvicorn                 transformer serve, transformer.serve
    export       transformers, ctranslate2, onnx,  transformer export (each format its own)
                 onnxscript, onnxruntime
    interop      transformers, tokenizers,        transformer import, transformer.interop's
                 huggingface_hub                  Hugging Face functions
    tensorboard  tensorboard                      training with tensorboard=true

Code that needs one calls :func:`require` just before importing it, so a missing package
is one line that says which extra to install, not an ImportError from deep inside.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .errors import UserError

EXTRAS = ("serve", "export", "interop", "tensorboard")


class MissingExtra(UserError, ImportError):
    """An optional package is not installed. A UserError, so the CLI prints it as one line
    (exit 2); an ImportError, so code that catches a failed import still catches it."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` (dotted) and return it, or raise :class:`MissingExtra` naming the
    ``pip install`` that fixes it. ``what`` says what needs it, e.g. "transformer serve"."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; one of {EXTRAS}")
    package = module.split(".")[0]
    fix = f"pip install '.[{extra}]' (in the project's folder)"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != package:  # installed, but its own dependency is missing
            raise MissingExtra(f"{what} needs {package}, which cannot be imported ({e}); "
                               f"reinstall it with {fix}") from None
        raise MissingExtra(f"{what} needs {package}, which is not installed: {fix}") from None
    except ImportError as e:  # installed but broken (a wrong version of one of its dependencies, ...)
        raise MissingExtra(f"{what} needs {package}, which cannot be imported ({e}); "
                           f"reinstall it with {fix}") from None
