"""The layering rule: inference code never imports training code.

The run directory layer (transformer.run) sits below both; translation, the service,
export, evaluation and the pictures read models through it. A module outside
``transformer.train`` that imports from it (directly, relatively, or inside a function)
fails this test. Only the commands that train are allowed to."""
from __future__ import annotations

import ast
from pathlib import Path

import transformer

PACKAGE = Path(transformer.__file__).parent
ALLOWED = {"cli/train.py", "cli/demo.py", "cli/explain.py"}  # the commands that train a model (explain --training: one update, in memory)


def imported_modules(source: str, package: str) -> set[str]:
    """Every ``transformer`` module that ``source``, a module of ``package`` (dotted), imports."""
    here = package.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *filter(None, (node.module or "").split("."))])
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] == "transformer"}


def is_training(module: str) -> bool:
    return module == "transformer.train" or module.startswith("transformer.train.")


def test_inference_code_never_imports_training_code():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("train/") or rel in ALLOWED:
            continue
        package = ".".join(("transformer", *path.relative_to(PACKAGE).parent.parts))
        bad = sorted(filter(is_training, imported_modules(path.read_text(encoding="utf-8"), package)))
        if bad:
            offenders[rel] = bad
    assert not offenders, f"inference modules importing transformer.train: {offenders}"


def test_the_rule_sees_every_kind_of_import():
    """The check itself: relative, absolute and nested imports of train/ are caught; the
    run layer and a module's own package are not."""
    for source in ("from ..train import checkpoint", "import transformer.train.trainer",
                   "from transformer.train.step import train_step",
                   "def f():\n    from ..train.checkpoint import load_training_state\n", "from .. import train"):
        assert any(map(is_training, imported_modules(source, "transformer.decode"))), source
    for source in ("from ..run import load_model", "from .greedy import greedy_search", "import torch"):
        assert not any(map(is_training, imported_modules(source, "transformer.decode"))), source
