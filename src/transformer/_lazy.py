"""Names a package serves on first use (PEP 562): one implementation for every package that
defers its imports (``transformer`` itself, ``transformer.run``). Imports nothing."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_names(package: str, names: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package``: each of ``names`` (public name ->
    module relative to the package) is imported when first looked up, then kept in the
    package's ``namespace`` so the next lookup is a plain attribute."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
