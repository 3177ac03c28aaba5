"""A step built ahead of time (AOTInductor): :mod:`.graph`'s step exported with ``torch.export``
and built by inductor into a package (a ``.pt2`` file: generated C++ and the frozen weights), one
per search kind, named by a digest of all it depends on (no proof of origin: :mod:`.packages`)."""
from __future__ import annotations

import hashlib
import platform
import warnings
from functools import cache
from pathlib import Path

import torch
from torch import nn

from ..decode import decoding_copy
from ..decode.eager_step import is_translation
from ..run.files import atomic_write
from .graph import GenerationStep, TranslationStep
from ..run.private import use_private_build_folder
from .search_step import FixedKVCache

# How inductor builds a package (measured in benchmarks/decode/README.md):
INDUCTOR_OPTIONS = {
    # the weights are constants of the graph, so each linear layer is one prepacked product
    "freezing": True,
    # each matrix product may be inductor's own C++ template (AMX tiles for bf16 weights)
    # instead of a oneDNN or aten call, whose fixed cost is most of a product of a few rows:
    # both are timed once, while the package is built, and the faster is kept
    "max_autotune_gemm": True, "max_autotune_gemm_backends": "CPP,ATEN",
    # nothing of that timing on stderr
    "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False,
}


def step_module(model: nn.Module, group: int, logprobs: bool) -> nn.Module:
    """The step a package of ``model`` holds, as the module that is exported (or run eagerly)."""
    return TranslationStep(model, group, logprobs) if is_translation(model) else GenerationStep(model, 1, logprobs)


def _example(model: nn.Module, group: int):
    """Example inputs made by the model's own code (so their dtypes and layouts are a
    search's), all of different sizes, and the symbolic sizes of each."""
    from torch.export import Dim

    cfg, device = model.cfg, next(model.parameters()).device
    capacity = min(cfg.max_len, 11)
    upto = min(capacity, 4)
    head = (torch.tensor([upto - 1], device=device), torch.arange(upto, device=device))  # index, slots
    sentences = Dim("sentences", min=1)  # (for a language model: its rows)
    rows = sentences if group == 1 else group * sentences
    kv = {0: rows, 2: Dim("capacity", min=1, max=cfg.max_len)}
    common = dict(index=None, slots={0: Dim("upto", min=1, max=cfg.max_len)}, k=(kv,) * cfg.n_layers,
                  v=(kv,) * cfg.n_layers)
    if is_translation(model):
        src = torch.full((3, min(cfg.max_len, 5)), 4, dtype=torch.long, device=device)
        cache = model.start_cache(model.encode(src), src)
        fixed = FixedKVCache.empty(model, 3 * group, capacity)
        cross = {0: sentences, 2: Dim("source", min=1, max=cfg.max_len)}
        args = (torch.full((3 * group, 1), 4, dtype=torch.long, device=device), *head, fixed.k, fixed.v,
                tuple(k.contiguous() for k, _ in cache.cross_kv), tuple(v.contiguous() for _, v in cache.cross_kv),
                cache.memory_mask)
        return args, dict(tgt={0: rows}, **common, cross_k=(cross,) * cfg.n_layers, cross_v=(cross,) * cfg.n_layers,
                          memory_mask={0: sentences, 3: cross[2]})
    fixed = FixedKVCache.empty(model, 6, capacity)
    tokens = torch.full((6, 1), 4, dtype=torch.long, device=device)
    args = (tokens, torch.ones_like(tokens, dtype=torch.bool), *head, fixed.k, fixed.v, fixed.key_mask,
            fixed.next_position)
    return args, dict(tokens={0: rows}, real={0: rows}, **common, key_mask={0: rows, 1: kv[2]},
                      next_position={0: rows})


def build(model: nn.Module, group: int, logprobs: bool, path: str | Path) -> None:
    """Export the step of ``model`` (``group`` decoder rows per source sentence; a language
    model: 1) and build its package into ``path``, atomically: a package is either whole or
    absent, even if the build is interrupted. Takes tens of seconds to minutes."""
    use_private_build_folder()  # the code inductor generates and loads: never a shared folder
    args, shapes = _example(model, group)

    def write(tmp: str) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            # inductor's GEMM timing calls a deprecated storage method of torch's own
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            program = torch.export.export(step_module(model, group, logprobs), args, dynamic_shapes=shapes,
                                          strict=False)
            torch._inductor.aoti_compile_and_package(program, package_path=tmp,
                                                      inductor_configs=dict(INDUCTOR_OPTIONS))  # (it adds to the dict)

    atomic_write(path, write, suffix=".pt2")  # (AOTInductor writes only to a name ending in .pt2)


def load(path: str | Path):
    """The step in the package at ``path``, called as the exported module. (Torch's loader
    itself: ``aoti_load_package`` spends seconds probing the CPU in subprocesses, which
    :func:`package_name` holds, and parses the input spec again at every call.)"""
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def run(*args):
        flat = [t for a in args for t in (a if isinstance(a, tuple) else (a,))]
        return loader.boxed_run(flat)[0]

    return run


def package_name(model: nn.Module, group: int, logprobs: bool) -> str:
    """``<kind>-<digest>.pt2``: the search and the weights' dtype, and a digest of torch, the CPU,
    the model's class, config, mode, weights and buffers, the step's and inductor's options and
    the source of the code it is built from."""
    h = hashlib.sha256()
    for part in (torch.__version__, _cpu(), type(model).__qualname__, repr(model.cfg), model.training,
                 group, logprobs, sorted(INDUCTOR_OPTIONS.items()), _source_digest()):
        h.update(repr(part).encode())
    for name, t in (*decoding_copy.named_weights(model), *model.named_buffers()):  # (packed ones read back)
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    dtype = "int8" if any(hasattr(m, "qweight") for m in model.modules()) else \
        str(next(p for p in model.parameters() if p.is_floating_point()).dtype).removeprefix("torch.")
    kind = ("search" + ("-greedy" if group == 1 else f"-beam{group}") if is_translation(model) else "generate")
    return f"{kind}-{dtype}{'-logprobs' if logprobs and not is_translation(model) else ''}-{h.hexdigest()[:20]}.pt2"


@cache
def _cpu() -> str:
    """The machine and its vector instructions (the generated code uses them: AVX-512, AMX)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} {flags.strip()}"


@cache
def _source_digest() -> str:
    """A digest of the code a package is built from: the model, this package's step, the
    graph's attention, the log-probabilities, the int8 layers and the cache's buffers."""
    root = Path(__file__).resolve().parent.parent
    files = [*sorted((root / "model").glob("*.py")), *sorted((root / "compiled").glob("*.py")),
             *sorted((root / "kernels").glob("*.py")),
             *(root / "decode" / n for n in ("scoring.py", "precision.py", "fixed_cache.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()
