"""The layering rules: each layer imports only the ones below it; nothing runs back up.

    inference code never imports training code (transformer.run sits below both; translation,
        the service, export, evaluation and the pictures read models through it; only the
        commands that train may import transformer.train)
    the model imports nothing of decoding, training, data, the run directory, the service, the
        pictures, the CLI, interop, compiled decoding, the two front doors (Translator, Generator)
        or their shared base (front_door), and no torch compiler internals (torch._inductor,
        torch.export): compiling is compiled/'s business
    no search imports compiled decoding: it is handed a step (the front door chooses it), and
        compiled decoding imports no search, training, service, CLI or front door
    the data layer imports no model, and no run module that builds one (run.files and
        run.layout are below it; run.weights is above the model)
    decoding imports no training
    no two modules import each other, directly or round a longer circle (the one known circle
        is named in KNOWN_CIRCLES)
    training imports none of the pictures, the service or the commands (the walkthrough of one
        update lives in viz/ and imports training, not the other way round)
    training imports no compiled decoding and no front door (inference/): its compiled update
        and the compiled step share the graph's attention from transformer.kernels, below both;
        its validation BLEU runs the searches itself; kernels/ imports nothing above the model

A rule is checked on the source (direct, relative and function-local imports all count) and,
for the data layer, in a fresh interpreter: importing every data module loads no model."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import transformer
import transformer.run

PACKAGE = Path(transformer.__file__).parent
# the commands that train a model, and the walkthrough of one update that explain --training
# makes in memory (beside the other walkthroughs, in viz/; nothing in train/ imports viz/)
ALLOWED = {"cli/train.py", "cli/demo.py", "cli/explain.py", "viz/walkthrough_training.py"}


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


def under(module: str, layer: str) -> bool:
    """``module`` is ``transformer.<layer>`` or inside it (``layer``: "train", "run.weights")."""
    name = f"transformer.{layer}"
    return module == name or module.startswith(name + ".")


def is_training(module: str) -> bool:
    return under(module, "train")


def modules(folder: str) -> dict[str, set[str]]:
    """{path relative to the package: the transformer modules it imports} for every module of ``folder``."""
    found = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        package = ".".join(("transformer", *path.relative_to(PACKAGE).parent.parts))
        found[path.relative_to(PACKAGE).as_posix()] = imported_modules(path.read_text(encoding="utf-8"), package)
    return found


def offenders(folder: str, forbidden) -> dict[str, list[str]]:
    """{module of ``folder``: the imports ``forbidden(module name)`` refuses}."""
    bad = {rel: sorted(filter(forbidden, imports)) for rel, imports in modules(folder).items()}
    return {rel: mods for rel, mods in bad.items() if mods}


def test_inference_code_never_imports_training_code():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("train/") or rel in ALLOWED:
            continue
        package = ".".join(("transformer", *path.relative_to(PACKAGE).parent.parts))
        bad = sorted(filter(is_training, imported_modules(path.read_text(encoding="utf-8"), package)))
        if bad:
            found[rel] = bad
    assert not found, f"inference modules importing transformer.train: {found}"


def test_the_rule_sees_every_kind_of_import():
    """The check itself: relative, absolute and nested imports of train/ are caught; the
    run layer and a module's own package are not."""
    for source in ("from ..train import checkpoint", "import transformer.train.trainer",
                   "from transformer.train.update import train_step",
                   "def f():\n    from ..train.checkpoint import load_training_state\n", "from .. import train"):
        assert any(map(is_training, imported_modules(source, "transformer.decode"))), source
    for source in ("from ..run import load_model", "from .greedy import greedy_search", "import torch"):
        assert not any(map(is_training, imported_modules(source, "transformer.decode"))), source


# the layers above the model: it knows no corpus, search, optimizer, file layout or screen
ABOVE_MODEL = ("decode", "train", "data", "run", "serve", "viz", "inspect", "cli", "interop", "compiled",
               "inference", "evaluation", "kernels")


def test_the_model_imports_nothing_above_it():
    found = offenders("model", lambda m: any(under(m, layer) for layer in ABOVE_MODEL))
    assert not found, f"model modules importing the layers above the model: {found}"


def test_every_layer_above_the_model_exists():
    """The list names real modules or packages (a misspelt or renamed one would guard nothing)."""
    layers = [layer.replace(".", "/") for layer in (*ABOVE_MODEL, *ABOVE_COMPILED)]
    missing = [layer for layer in layers
               if not ((PACKAGE / layer / "__init__.py").is_file() or (PACKAGE / f"{layer}.py").is_file())]
    assert not missing, missing


def torch_internals(source: str) -> set[str]:
    """The torch compiler internals ``source`` imports or reaches: torch._inductor and
    torch.export, by an import or as an attribute of ``torch``."""
    inside = ("torch._inductor", "torch.export")
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            names.add(f"torch.{node.attr}")
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in inside)}


def test_the_model_imports_no_compiler_internals():
    found = {}
    for path in sorted((PACKAGE / "model").rglob("*.py")):
        bad = torch_internals(path.read_text(encoding="utf-8"))
        if bad:
            found[path.relative_to(PACKAGE).as_posix()] = sorted(bad)
    assert not found, f"model modules importing torch compiler internals: {found}"


def test_the_compiler_rule_sees_imports_and_attributes():
    for source in ("import torch._inductor.config", "from torch._inductor import config", "from torch import export",
                   "import torch.export", "from torch.export import export",
                   "def f(m, x):\n    return torch.export.export(m, x)\n", "torch._inductor.config.freezing = True"):
        assert torch_internals(source), source
    for source in ("import torch", "torch.compiler.is_compiling()", "torch.compiler.is_exporting()",
                   "from torch import nn", "import torch.nn.functional as F"):
        assert not torch_internals(source), source


def run_modules_building_models() -> set[str]:
    """The run modules that import the model (run.weights), by their dotted names."""
    return {f"transformer.run.{Path(rel).stem}" for rel, imports in modules("run").items()
            if Path(rel).name != "__init__.py" and any(under(m, "model") for m in imports)}


def loads_a_model(module: str) -> bool:
    """Importing ``module`` (or the name it stands for) loads the model: the model itself, a
    run module that builds one, or a name the run package serves from such a module."""
    if under(module, "model"):
        return True
    building = run_modules_building_models()
    if any(module == m or module.startswith(m + ".") for m in building):
        return True
    name = module.removeprefix("transformer.run.")
    lazy = transformer.run._LAZY
    return name in lazy and f"transformer.run{lazy[name]}" in building


def test_the_data_layer_imports_no_model():
    assert run_modules_building_models() == {"transformer.run.weights"}  # the check knows what it guards
    found = offenders("data", loads_a_model)
    assert not found, f"data modules importing the model: {found}"


def test_the_data_rule_sees_the_run_modules_that_build_models():
    for source in ("from ..model.embedding import TokenEmbedding", "from ..run.weights import save_weights",
                   "from ..run import load_model", "from ..run import weights", "import transformer.model"):
        assert any(map(loads_a_model, imported_modules(source, "transformer.data"))), source
    for source in ("from ..run.files import atomic_write", "from ..run.layout import SUBWORDS, run_file",
                   "from ..run import write_text_atomic", "from ..errors import UserError"):
        assert not any(map(loads_a_model, imported_modules(source, "transformer.data"))), source


def test_training_imports_nothing_that_shows_or_serves():
    found = offenders("train", lambda m: any(under(m, layer) for layer in ("viz", "inspect", "serve", "cli")))
    assert not found, f"train modules importing the pictures, the service or the commands: {found}"


def test_decoding_imports_no_training():
    found = offenders("decode", is_training)
    assert not found, f"decode modules importing transformer.train: {found}"


def above_training(module: str) -> bool:
    """What training may not import: compiled decoding and the front doors."""
    return under(module, "compiled") or under(module, "inference")


def test_training_imports_no_compiled_decoding_and_no_front_door():
    found = offenders("train", above_training)
    assert not found, f"train modules importing transformer.compiled or transformer.inference: {found}"


def test_the_training_rule_sees_the_imports_it_refuses():
    for source in ("from ..compiled.graph import TranslationStep", "from .. import compiled",
                   "from ..inference.translator import Translator", "import transformer.inference",
                   "def f():\n    from ..compiled import step\n"):
        assert any(map(above_training, imported_modules(source, "transformer.train"))), source
    for source in ("from ..kernels.attention import graph_attention", "from ..decode import greedy_search"):
        assert not any(map(above_training, imported_modules(source, "transformer.train"))), source


TRAINING_LOADS = """
import importlib, json, pkgutil, sys
import transformer.train
for info in pkgutil.iter_modules(transformer.train.__path__):
    importlib.import_module(f"transformer.train.{info.name}")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("transformer."))))
"""


def test_importing_training_loads_no_compiled_decoding_and_no_front_door():
    """In a fresh interpreter: every training module imported, and nothing of compiled
    decoding or the front doors came with them, however indirectly."""
    done = subprocess.run([sys.executable, "-c", TRAINING_LOADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "transformer.train.torch_compile" in loaded and "transformer.kernels.attention" in loaded
    assert not [m for m in loaded if above_training(m)]


# the graph's attention sits just above the model: nothing it imports may stand higher
def test_the_graph_kernels_import_only_the_model():
    found = offenders("kernels", lambda m: any(under(m, layer) for layer in ABOVE_MODEL if layer != "kernels"))
    assert not found, f"kernels modules importing layers above the model: {found}"


def test_no_search_imports_compiled_decoding():
    found = offenders("decode", lambda m: under(m, "compiled"))
    assert not found, f"decode modules importing transformer.compiled: {found}"


# what compiled decoding may not reach: the searches (it serves them a step, as the eager one
# does), training, the service, the commands, the front doors
ABOVE_COMPILED = ("decode.greedy", "decode.beam", "decode.sample", "decode.ensemble", "train", "serve", "cli", "viz",
                  "inspect", "inference", "evaluation")


def test_compiled_decoding_imports_nothing_above_it():
    found = offenders("compiled", lambda m: any(under(m, layer) for layer in ABOVE_COMPILED))
    assert not found, f"compiled modules importing what stands above them: {found}"


LOADED = """
import importlib, json, pkgutil, sys
import transformer.data
after_package = sorted(m for m in sys.modules if m.startswith("transformer."))
for info in pkgutil.iter_modules(transformer.data.__path__):
    importlib.import_module(f"transformer.data.{info.name}")
print(json.dumps({"package": after_package, "all": sorted(m for m in sys.modules if m.startswith("transformer."))}))
"""


def test_importing_the_data_layer_loads_no_model():
    """In a fresh interpreter (this one has imported everything already): ``import
    transformer.data``, then every module in it, and no model module is loaded."""
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    for when in ("package", "all"):
        models = [m for m in loaded[when] if m.startswith(("transformer.model", "transformer.run.weights"))]
        assert not models, f"importing the data layer ({when}) loaded {models}"
    assert "transformer.data.word_vectors" in loaded["all"]  # the probe did import every data module


BASE = """
import json, sys
import transformer.run.files, transformer.run.layout
print(json.dumps(sorted(m for m in sys.modules if m.startswith("transformer"))))
"""


def test_the_atomic_writers_and_the_layout_import_nothing_of_the_package():
    """``run.files`` and ``run.layout`` are below every layer: loading them loads the package's
    error type and nothing else of it (besides ``transformer._lazy``, the packages' deferred
    imports, which imports nothing)."""
    done = subprocess.run([sys.executable, "-c", BASE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["transformer", "transformer._lazy", "transformer.errors", "transformer.run",
                                       "transformer.run.files", "transformer.run.layout"]


def test_every_run_name_still_imports():
    """The run package serves its names on first use; each one is there, and an unknown one
    is an AttributeError."""
    assert all(getattr(transformer.run, name) is not None for name in transformer.run.__all__)
    assert set(transformer.run.__all__) <= set(dir(transformer.run))
    with pytest.raises(AttributeError, match="no attribute 'load_modle'"):
        transformer.run.load_modle  # noqa: B018


CONFIG_ONLY = """
import json, sys
from transformer.decode.decoding_config import DecodingConfig
DecodingConfig(beam=2, precision="int8")
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("transformer", "torch")))))
"""


def test_the_decoding_config_imports_nothing_heavy():
    """Reading decoding settings loads no torch, no search and no model: the config is the
    standard library only (its package serves the searches on first use)."""
    done = subprocess.run([sys.executable, "-c", CONFIG_ONLY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["transformer", "transformer._lazy", "transformer.decode",
                                       "transformer.decode.decoding_config", "transformer.errors", "transformer.frozen"]


def test_every_decode_name_still_imports():
    import transformer.decode

    assert all(getattr(transformer.decode, name) is not None for name in transformer.decode.__all__)
    with pytest.raises(AttributeError, match="no attribute 'beam_serch'"):
        transformer.decode.beam_serch  # noqa: B018


# what every layer uses, and nothing else, stays at the package root: inference, evaluation and
# the model's config each live in their own package
ROOT_MODULES = {"_lazy.py", "errors.py", "extras.py", "frozen.py", "hardware.py"}


def test_the_package_root_holds_only_what_everything_uses():
    modules = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert modules == ROOT_MODULES, f"modules at the package root: {sorted(modules)}"
    assert len(ROOT_MODULES) <= 5


def module_file(name: str) -> Path | None:
    """The file of the package's module ``name`` (dotted), or None when ``name`` is not a
    module (a function or class imported from one)."""
    parts = name.split(".")[1:]
    for path in (PACKAGE.joinpath(*parts).with_suffix(".py") if parts else None,
                 PACKAGE.joinpath(*parts, "__init__.py")):
        if path is not None and path.is_file():
            return path
    return None


def import_graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports} for every module of the package, by dotted
    name (a package is its __init__); direct, relative and function-local imports all count.
    A module's own packages are left out (``from . import records`` names viz/'s): Python
    loads them before the module, whatever it imports."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        parts = rel.parent.parts if rel.name == "__init__.py" else (*rel.parent.parts, rel.stem)
        name = ".".join(("transformer", *parts))
        package = ".".join(("transformer", *rel.parent.parts))
        imported = imported_modules(path.read_text(encoding="utf-8"), package)
        graph[name] = {m for m in imported
                       if not (name == m or name.startswith(m + ".")) and module_file(m) is not None}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a longer circle (the
    strongly connected components of more than one module, Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


# The one circle still standing, named so that no other joins it unseen: choose.py times the int8
# layers of precision.py, and precision.py asks choose.py what it measured (inside functions);
# the int8 layers want a module of their own below both. Once it is gone, its entry goes too.
KNOWN_CIRCLES: list[list[str]] = []


def test_no_two_modules_import_each_other():
    """A circle of imports (even inside functions) means two modules each need the other: the
    piece they share belongs below both."""
    circles = import_circles(import_graph())
    assert [c for c in circles if c not in KNOWN_CIRCLES] == [], f"modules that import each other: {circles}"
    assert [c for c in KNOWN_CIRCLES if c not in circles] == [], "a known circle is gone: remove it from KNOWN_CIRCLES"


def test_the_circle_check_sees_a_circle_through_a_function():
    a = imported_modules("def f():\n    from .b import g\n", "transformer.interop")
    b = imported_modules("from .c import h\n", "transformer.interop")
    c = imported_modules("import transformer.interop.a\n", "transformer.interop")
    graph = {"transformer.interop.a": a, "transformer.interop.b": b, "transformer.interop.c": c,
             "transformer.interop.d": {"transformer.interop.a"}}
    graph = {k: {m for m in v if m in graph} for k, v in graph.items()}
    assert import_circles(graph) == [["transformer.interop.a", "transformer.interop.b", "transformer.interop.c"]]
    del graph["transformer.interop.c"]
    assert import_circles(graph) == []
    assert "transformer.interop.hf_import" in import_graph()  # the real graph holds the package's modules
