"""A decoding step compiled ahead of time (AOTInductor): exported once with ``torch.export``,
built by inductor into a package of generated C++ (a ``.pt2`` file holding a shared library
and the model's frozen weights), and loaded by any later process in a fraction of a second.

What is compiled is one step of a search on a fixed-shape cache,
:func:`~transformer.decode.fixed.translation_step` of a :class:`~transformer.model.Transformer`
or :func:`~transformer.decode.fixed.generation_step` of a
:class:`~transformer.model.LanguageModel`, with the sizes that change from one
step or search to the next as symbolic sizes of the one graph: the decoder rows, the source
length, the cache's capacity and the slots written so far. Only one size is not symbolic: the
rows per source sentence (1 for greedy search, the beam size for beam search), so a search
kind has a package of its own.

A package is valid only for the weights, code, torch build and CPU it was made with; its
file name holds a digest of them all (:func:`package_name`), so a changed model, a new
version of this package's code or another machine never loads a stale one. That name is no
proof of origin (anyone can compute it): loading a package runs the library inside it, so
:mod:`transformer.decode.static` loads only packages of the user's own cache whose SHA-256
is the one their build recorded (:mod:`transformer.decode.packages`).
"""
from __future__ import annotations

import hashlib
import platform
import warnings
from functools import cache
from pathlib import Path

import torch
from torch import nn

from ..run.files import atomic_write
from .packages import use_private_build_folder
from . import fixed
from .common import next_token_logprobs
from .rows import expand_rows
from .steps import is_translation

FORMAT = 1  # bumped when what a package holds, or how it is called, changes

# How inductor builds a package (measured in benchmarks/decode/README.md):
INDUCTOR_OPTIONS = dict(
    # the weights are constants of the graph, so each linear layer is one prepacked product
    freezing=True,
    # each matrix product may be inductor's own C++ template (AMX tiles for bf16 weights)
    # instead of a oneDNN or aten call, whose fixed cost is most of a product of a few rows:
    # both are timed once, while the package is built, and the faster is kept
    max_autotune_gemm=True,
    max_autotune_gemm_backends="CPP,ATEN",
    # nothing of that timing on stderr
    autotune_num_choices_displayed=0,
    max_autotune_report_choices_stats=False,
)


class _TranslationStep(nn.Module):
    """:func:`~transformer.decode.fixed.translation_step` on flat tensors: ``slots`` (U,)
    stands for ``upto`` (a size, so that it is symbolic), the cross-attention K and V come
    as two tuples."""

    def __init__(self, model: nn.Module, group: int, logprobs: bool) -> None:
        super().__init__()
        self.model, self.group, self.logprobs = model, group, logprobs

    def forward(self, tgt, index, slots, k, v, cross_k, cross_v, memory_mask):
        logits = fixed.translation_step(self.model, tgt, index, k, v, tuple(zip(cross_k, cross_v)), memory_mask,
                                        slots.size(0), self.group)
        return next_token_logprobs(logits, self.model.cfg) if self.logprobs else logits


class _LanguageModelStep(nn.Module):
    """:func:`~transformer.decode.fixed.generation_step` with ``upto`` given as the size of
    ``slots`` (U,)."""

    def __init__(self, model: nn.Module, logprobs: bool) -> None:
        super().__init__()
        self.model, self.logprobs = model, logprobs

    def forward(self, tokens, real, index, slots, k, v, key_mask, next_position):
        logits = fixed.generation_step(self.model, tokens, real, index, k, v, key_mask, next_position,
                                       slots.size(0))
        return next_token_logprobs(logits, self.model.cfg) if self.logprobs else logits


def _example(model: nn.Module, group: int, logprobs: bool):
    """The module to export, example inputs made by the model's own code (so their shapes,
    dtypes and layouts are those of a search) and the symbolic sizes of each."""
    from torch.export import Dim

    cfg, device = model.cfg, next(model.parameters()).device
    capacity = min(cfg.max_len, 11)
    upto = min(capacity, 4)
    slot = torch.tensor([upto - 1], device=device)
    slots = torch.arange(upto, device=device)
    sentences = Dim("sentences", min=1)  # (for a language model: its rows)
    rows = sentences if group == 1 else group * sentences
    kv = {0: rows, 2: Dim("capacity", min=1, max=cfg.max_len)}
    written = {0: Dim("upto", min=1, max=cfg.max_len)}
    layers = cfg.n_layers
    if is_translation(model):
        src = torch.full((3, min(cfg.max_len, 5)), 4, dtype=torch.long, device=device)
        cache = model.start_cache(model.encode(src), src)
        static = fixed.start_translation(model, expand_rows(cache, group) if group > 1 else cache, capacity)
        module = _TranslationStep(model, group, logprobs)
        args = (torch.full((3 * group, 1), 4, dtype=torch.long, device=device), slot, slots, static.k, static.v,
                tuple(c[0] for c in static.cross_kv), tuple(c[1] for c in static.cross_kv), cache.memory_mask)
        cross = {0: sentences, 2: Dim("source", min=1, max=cfg.max_len)}
        shapes = dict(tgt={0: rows}, index=None, slots=written,
                      k=(kv,) * layers, v=(kv,) * layers, cross_k=(cross,) * layers, cross_v=(cross,) * layers,
                      memory_mask={0: sentences, 3: cross[2]})
    else:
        static = fixed.start_generation(model, 6, capacity)
        module = _LanguageModelStep(model, logprobs)
        tokens = torch.full((6, 1), 4, dtype=torch.long, device=device)
        args = (tokens, torch.ones_like(tokens, dtype=torch.bool), slot, slots, static.k, static.v, static.key_mask,
                static.next_position)
        shapes = dict(tokens={0: rows}, real={0: rows}, index=None, slots=written,
                      k=(kv,) * layers, v=(kv,) * layers, key_mask={0: rows, 1: kv[2]}, next_position={0: rows})
    return module, args, shapes


def build(model: nn.Module, group: int, logprobs: bool, path: str | Path) -> None:
    """Export the step of ``model`` (``group`` decoder rows per source sentence; a language
    model: 1) and build its package into ``path``, atomically: a package is either whole or
    absent, even if the build is interrupted. Takes tens of seconds to minutes."""
    use_private_build_folder()  # the code inductor generates and loads: never a shared folder
    module, args, shapes = _example(model, group, logprobs)

    def write(tmp: str) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            # inductor's GEMM timing calls a deprecated storage method of torch's own
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
            torch._inductor.aoti_compile_and_package(program, package_path=tmp,
                                                      inductor_configs=dict(INDUCTOR_OPTIONS))  # (it adds to the dict)

    atomic_write(path, write, suffix=".pt2")  # (AOTInductor writes only to a name ending in .pt2)


def eager_step(model: nn.Module, group: int, logprobs: bool) -> nn.Module:
    """What the package of ``model``'s step holds, run eagerly: a callable with the inputs and
    output of :func:`load`'s (what decoding falls back to when no package can be built or
    loaded)."""
    return _TranslationStep(model, group, logprobs) if is_translation(model) else _LanguageModelStep(model, logprobs)


def load(path: str | Path):
    """The step in the package at ``path``: a callable taking the inputs of the module that
    was exported (:class:`_TranslationStep` or :class:`_LanguageModelStep`: tensors, and
    tuples of tensors), returning its one output tensor.

    Loaded with torch's package loader itself, not ``torch._inductor.aoti_load_package``,
    which spends seconds probing the CPU's vector instructions in subprocesses (to compare
    them with the builder's: :func:`package_name` already holds them) and parses the call's
    input spec again at every call."""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def run(*args):
        flat = [t for a in args for t in (a if isinstance(a, tuple) else (a,))]
        return loader.boxed_run(flat)[0]

    return run


def package_name(model: nn.Module, group: int, logprobs: bool) -> str:
    """``<kind>-<digest>.pt2``: the kind of step (which search, the weights' dtype) in words,
    and a digest of everything the package depends on: this format, the torch build, the
    CPU's vector instructions, the model's class, config, mode and every weight and buffer,
    the step's own options, inductor's options and the source of the model's code."""
    h = hashlib.sha256()
    for part in (FORMAT, torch.__version__, _cpu(), type(model).__qualname__, repr(model.cfg), model.training,
                 group, logprobs, sorted(INDUCTOR_OPTIONS.items()), _source_digest()):
        h.update(repr(part).encode())
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    dtype = "int8" if any(hasattr(m, "qweight") for m in model.modules()) else \
        str(next(p for p in model.parameters() if p.is_floating_point()).dtype).removeprefix("torch.")
    kind = ("search" + ("-greedy" if group == 1 else f"-beam{group}") if is_translation(model) else "generate")
    return f"{kind}-{dtype}{'-logprobs' if logprobs and not is_translation(model) else ''}-{h.hexdigest()[:20]}.pt2"


@cache
def _cpu() -> str:
    """The machine and its vector instructions (the generated code uses them: AVX-512, AMX)."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} {flags.strip()}"


@cache
def _source_digest() -> str:
    """A digest of the code a package is built from: the model, the step (decode/fixed.py),
    the log-probabilities and the int8 layers."""
    root = Path(__file__).resolve().parent.parent
    files = [*sorted((root / "model").glob("*.py")),
             *(root / "decode" / n for n in ("aot.py", "common.py", "fixed.py", "precision.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()
