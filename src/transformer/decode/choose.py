"""What decoding multiplies in, measured on the machine at hand rather than read from its flags.

A CPU's flags do not say which product is fastest: on an AVX512-BF16 CPU without AMX, at an
opus-mt model's width, an int8 GEMM ran 2x a bf16 one, while on an AMX Xeon bf16 won; at
the demo model's width (128) float32 can beat both (``benchmarks/decode/README.md``,
``linear_kernels.py``). So the choice is timed, once per machine:

    precision auto   fp32 or bf16, whichever multiplies the model's decoder layers and its
                     output projection in less time (:func:`auto_precision`)
    int8 kernels     for each linear layer of an int8 model, the fastest of
                     :data:`~transformer.decode.int8.INT8_KERNELS` at its shape
                     (:func:`int8_kernels`)
    oneDNN           for each linear layer of an fp32 or bf16 model, the output projection
                     included, whether oneDNN's linear multiplies its shape clearly faster
                     than ``F.linear`` (:func:`onednn_shapes`; in float32 ``F.linear`` runs
                     MKL's GEMM, on an AMD EPYC 1.6-1.8x slower at an opus-mt vocabulary)
    prepacked        for each layer of a bf16 model, whether oneDNN with the weight packed once
                     (:func:`transformer.decode.decoding_copy.pack`) multiplies its shape faster
                     still (:func:`packed_shapes`; on an AMD EPYC with AVX512-BF16 1.4-1.7x
                     ``F.linear`` at Qwen2-0.5B's shapes at 1 to 16 rows)

Each (in, out) shape is timed at a few decoding batch sizes (:data:`ROWS`) with random
weights, every candidate in turn (seconds for a model on an idle machine), and kept as JSON in the user's private
cache beside the compiled decoding steps (``kernels-<digest>.json``), keyed by what the
times depend on: the CPU's name and flags and torch's kernels (its version and CPU
capability) (:func:`machine`). They are taken on one thread, in CPU time, so that other
load on the machine does not decide (:func:`_seconds`); the thread count is not in the key. A later process reads it back; a cache file that is not
this user's, that others may write, or that does not parse is ignored with one warning line
and measured again. Where measuring fails, the flags decide (:func:`by_flags`), with one
warning line; ``TRANSFORMER_MEASURE=off`` makes the flags decide without timing anything.
On a GPU the flags decide (torch's own check of bf16).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .. import hardware
from ..errors import OneLineWarning
from ..run import private
from ..run.files import atomic_write
from .decoding_copy import onednn_available, onednn_linear, onednn_packs, pack
from .int8 import INT8_KERNELS, Int8Linear, fbgemm_available, int_mm_exact

ENV_VAR = "TRANSFORMER_MEASURE"  # off: the CPU's flags decide, nothing is timed
#: decoder rows (sentences x beam) each shape is timed at; a candidate's score is the sum of its
#: times, so the larger batches that dominate a test set's decoding weigh most
ROWS = (16, 128)
ROUNDS, STEADY, MAX_ROUNDS = 5, 20, 400  # rounds in which the candidates take turns (a time is a
# candidate's fastest sample): at least ROUNDS, then until STEADY rounds brought nothing new
CAP_S = 1.0  # the most a (shape, rows) is timed for, beyond its first ROUNDS
CUT_S, GIVE_UP = 0.02, 4.0  # after 3 rounds, a candidate whose call costs over CUT_S and that is
# over GIVE_UP times the fastest is timed no further
MAX_OUT = 16384  # a wider layer (a vocabulary) is timed at this width and scaled
MAX_CACHE_BYTES = 1 << 20
# how the times were taken, and what was timed (fbgemm quantising each input row by its own
# range): another way is another cache
TIMING = "one thread, its CPU time, fastest call; fbgemm per row"
ONEDNN = {"fp32": "fp32-onednn", "bf16": "bf16-onednn"}  # a precision's candidate through oneDNN's linear
ONEDNN_GAIN = 0.85  # oneDNN is taken where it measured at most this fraction of F.linear's time: a
# shape where the two are level (most layer shapes) keeps F.linear, and its outputs, from run to run
PACKED = "bf16-packed"  # bf16 through oneDNN on a weight packed once (a bf16 copy owns its weights:
# the packed one replaces the plain one; an fp32 copy shares the caller's, so fp32 has no such candidate)
PACKED_GAIN = 0.95  # it is taken where it measured at most this fraction of the time of the kernel
# chosen without it: its products are oneDNN's unpacked ones bit for bit (and, in bf16, F.linear's),
# so a choice that changes from run to run changes no output; the margin keeps timing noise out


class MeasureWarning(OneLineWarning):
    """A measurement that failed (the flags decide) or a cache file ignored."""


_memory: dict[str, dict[str, dict[str, float]]] = {}  # cache file name -> shape -> candidate -> seconds
_failed: set[tuple[str, str]] = set()  # (machine, what) whose measurement failed in this process (warned once)


def switched_off() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() == "off"


# the variables that limit a kernel library's instructions below what the CPU has (as the AVX2
# stand-in sets them): times measured under one are not the times without it
KERNEL_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                 "FBGEMM_ENABLE_INSTRUCTIONS")


def machine() -> dict[str, object]:
    """What the measured times depend on, and so what the cache is keyed by."""
    limits = {name: os.environ[name] for name in KERNEL_LIMITS if os.environ.get(name)}
    return {"cpu": hardware.cpu_name(), "flags": sorted(hardware.cpu_flags()), "capability": hardware.cpu_capability(),
            "torch": torch.__version__, "rows": list(ROWS), "timing": TIMING, **({"limits": limits} if limits else {})}


def cache_file(key: dict[str, object]) -> Path | None:
    """The cache file of ``key`` in the private cache folder (None where there is no home)."""
    root = private.cache_root()
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return private.usable(root, "measured decoding choices are kept") / f"kernels-{digest}.json"


# --- the candidates ----------------------------------------------------------------------------

def candidates(d_in: int, d_out: int, rows: int, names) -> dict[str, tuple]:
    """name -> (call, its argument): one decoding call of a (d_in -> d_out) layer on ``rows``
    rows in each way ``names`` lists (fp32, bf16, or an int8 kernel), random weights."""
    gen = torch.Generator().manual_seed(0)
    # skip_init and a generator of its own: measuring draws nothing from the global RNG (training's
    # validation decodes in fp32, which measures too, and a resumed run must stay exact)
    linear = nn.utils.skip_init(nn.Linear, d_in, d_out)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(d_out, d_in, generator=gen) * d_in ** -0.5)
        linear.bias.copy_(torch.randn(d_out, generator=gen) * d_in ** -0.5)
    x = torch.randn(rows, d_in, generator=gen)
    out = {}
    for name in names:
        dtype = torch.bfloat16 if name.startswith("bf16") else torch.float32  # a bf16 model's activations are bf16
        w, b = linear.weight.detach().to(dtype), linear.bias.detach().to(dtype)
        if name in ("fp32", "bf16"):
            out[name] = (lambda v, w=w, b=b: F.linear(v, w, b), x.to(dtype))
        elif name in ONEDNN.values():
            out[name] = (lambda v, w=w, b=b: onednn_linear(v, w, b), x.to(dtype))
        elif name == PACKED:
            out[name] = (lambda v, w=pack(w), b=b: onednn_linear(v, w, b), x.to(dtype))
        else:
            out[name] = (Int8Linear.from_linear(linear, name), x)
    return out


def time_shape(d_in: int, d_out: int, names) -> dict[str, float]:
    """Seconds per call of each of ``names`` at a (d_in -> d_out) layer, summed over
    :data:`ROWS`, on one thread (:func:`_seconds`). The candidates take turns, round after
    round, each keeping its fastest call (infinite for one that fails to run: oneDNN's bf16
    where the CPU or ``ONEDNN_MAX_CPU_ISA`` has no bf16 instructions): at least :data:`ROUNDS` rounds, then until
    :data:`STEADY` rounds in a row improved no candidate's best by 2%, at most
    :data:`MAX_ROUNDS` or :data:`CAP_S`. After three
    rounds, a candidate whose calls cost over :data:`CUT_S` and which is over
    :data:`GIVE_UP` times the fastest (emulated bf16: 20x) is timed no further. An output
    wider than :data:`MAX_OUT` is timed at that width and scaled (the products' time grows
    in proportion to it there), so an opus-mt vocabulary costs a second, not ten."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return _time_rows(d_in, d_out, names)
    finally:
        torch.set_num_threads(threads)


def _time_rows(d_in: int, d_out: int, names) -> dict[str, float]:
    timed_out = min(d_out, MAX_OUT)
    total = dict.fromkeys(names, 0.0)
    for rows in ROWS:
        todo = candidates(d_in, timed_out, rows, names)
        best = dict.fromkeys(todo, float("inf"))
        for name, (call, arg) in list(todo.items()):
            try:
                call(arg)  # warm-up: fbgemm packs its weights, oneDNN picks its kernels
            except RuntimeError:  # a kernel this CPU cannot run as limited (oneDNN's bf16 under AVX2): never chosen
                del todo[name]
        active, start, r, steady = list(todo), time.perf_counter(), 0, 0
        while active and (r < ROUNDS or (steady < STEADY and r < MAX_ROUNDS and time.perf_counter() - start < CAP_S)):
            before = dict(best)
            for name in active[r % len(active):] + active[:r % len(active)]:
                best[name] = min(best[name], _seconds(*todo[name]))
            r += 1
            steady = steady + 1 if all(best[n] > 0.98 * before[n] for n in active) else 0
            if r >= 3:
                active = [n for n in active if best[n] <= CUT_S or best[n] <= GIVE_UP * min(best.values())]
        for name in names:
            total[name] += best[name] * d_out / timed_out
    return total


def _seconds(call, arg) -> float:
    """One call's time on one thread, as that thread's CPU time: the wall time of an idle
    machine, and unlike wall time it leaves out what other processes take while they hold
    the cores. At two threads neither clock held: on 2 cores shared 5 ways not one call in 60
    ran undisturbed, and a thread's CPU time counted its spinning while the other thread
    waited to be scheduled (weight-only int8 measured faster than plain bf16, which does
    less). The kernels' order at one thread is taken for theirs at any count: the products
    split their output columns across threads alike."""
    start = time.thread_time()
    call(arg)
    return time.thread_time() - start


def names_to_time() -> tuple[str, ...]:
    """fp32, bf16, both through oneDNN's linear, bf16 on oneDNN's packed weights (where oneDNN
    packs bf16 here), and the int8 kernels this torch build has (``int_mm`` where its sums are
    exact)."""
    return ("fp32", "bf16", *(ONEDNN.values() if onednn_available() else ()),
            *((PACKED,) if onednn_packs(torch.bfloat16) else ()),
            *(k for k in INT8_KERNELS if (k != "fbgemm" or fbgemm_available()) and (k != "int_mm" or int_mm_exact())))


# --- the cache ---------------------------------------------------------------------------------

def _read(path: Path) -> dict[str, dict[str, float]]:
    """The shapes' times in ``path``; empty (with one warning, unless there is no file) when it
    is missing, not a regular file of this user's, writable by others, or not what
    :func:`_write` writes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        return _ignored(path, e.strerror or str(e))
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return _ignored(path, "not a regular file")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            return _ignored(path, f"owned by another user (uid {st.st_uid})")
        if st.st_mode & 0o022:
            return _ignored(path, f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})")
        data = f.read(MAX_CACHE_BYTES + 1)
    try:
        shapes = json.loads(data.decode("utf-8"))["shapes"] if len(data) <= MAX_CACHE_BYTES else None
        if not (isinstance(shapes, dict) and all(
                isinstance(times, dict) and all(isinstance(s, (int, float)) and s > 0 for s in times.values())
                for times in shapes.values())):
            raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return _ignored(path, "not a cache of measured times")
    return {shape: {name: float(s) for name, s in times.items()} for shape, times in shapes.items()}


def _ignored(path: Path, why: str) -> dict:
    warnings.warn(f"{path}: {why}; ignored, measuring again", MeasureWarning, stacklevel=2)
    return {}


def _write(path: Path, key: dict, shapes: dict) -> None:
    text = json.dumps({"machine": key, "shapes": shapes}, indent=1, sort_keys=True)
    try:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 (a full disk: the times hold for this process)
        warnings.warn(f"{path}: cannot keep the measured times ({e}); measured again next time",
                      MeasureWarning, stacklevel=3)


def measured(shapes) -> dict[str, dict[str, float]] | None:
    """Seconds per call of each candidate (:func:`names_to_time`) at each (in, out) of
    ``shapes``: from this process's memory, else the cache file, else timed now and kept.
    None when measuring is switched off or failed (one warning line a process)."""
    names = names_to_time()
    return kept_times([f"{i}x{o}" for i, o in dict.fromkeys(shapes)], names, "decoding's kernels",
                      lambda shape: time_shape(*(int(n) for n in shape.split("x")), names))


def kept_times(want: list[str], names, what: str, time_one) -> dict[str, dict[str, float]] | None:
    """The times of each entry of ``want`` (an entry: name -> seconds for each of ``names``),
    from this process's memory, else this machine's cache file (:func:`machine`), else
    ``time_one(entry)`` now, kept in both. None when measuring is switched off, or failed
    (``what`` is named in one warning line a process; the caller's flags decide). Decoding's
    kernels and training's precision (train/auto_precision.py) share it: one cache, one way
    of keeping it."""
    if switched_off():
        return None
    key = machine()
    name = json.dumps(key, sort_keys=True)
    if (name, what) in _failed:
        return None
    known = _memory.get(name)
    if known is None or any(s not in known for s in want):
        path = cache_file(key)
        known = {**(_read(path) if path is not None else {}), **(known or {})}
        missing = [s for s in want if s not in known or set(known[s]) != set(names)]
        if missing:
            try:
                for entry in missing:
                    known[entry] = time_one(entry)
            except Exception as e:  # noqa: BLE001 (a kernel this build or CPU lacks, memory)
                _failed.add((name, what))
                first = (str(e).strip().splitlines() or [""])[0][:200]
                warnings.warn(f"cannot measure {what} on this CPU ({type(e).__name__}: {first}); "
                              "choosing by its flags", MeasureWarning, stacklevel=4)
                return None
            if path is not None:
                _write(path, key, known)
        _memory[name] = known
    return {s: known[s] for s in want}


# --- the choices -------------------------------------------------------------------------------

def by_flags(kind: str, device: str | torch.device = "cpu") -> str:
    """The choice where nothing is measured: ``kind`` "auto" -> bf16 where the device computes
    it natively, else fp32 (:func:`transformer.hardware.resolve`); "int8" -> the kernel that
    measured fastest on CPUs like this one (``benchmarks/decode/README.md``): weight-only bf16
    on AMX, fbgemm's int8 GEMM elsewhere, weight-only fp32 where torch has no fbgemm."""
    if kind == "auto":
        return hardware.resolve(hardware.AUTO, device)
    if hardware.cpu_has_native_bf16() and "amx_bf16" in hardware.cpu_flags():
        return "weight-only-bf16"
    return "fbgemm" if fbgemm_available() else "weight-only-fp32"


def decoder_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every linear layer a decoding step runs (the decoder's and the output
    projection, a tied one included), once per layer: a step's products (an ensemble's: its
    members')."""
    if hasattr(model, "members"):
        return [shape for member in model.members for shape in decoder_shapes(member)]
    shapes = [(m.in_features, m.out_features) for m in model.decoder.modules()
              if isinstance(m, (nn.Linear, Int8Linear))]
    weight = model.output_layer()[0]
    out_proj = getattr(model, "out_proj", None)
    if isinstance(out_proj, Int8Linear):
        shapes.append((out_proj.in_features, out_proj.out_features))
    elif isinstance(weight, torch.Tensor):
        shapes.append((weight.size(1), weight.size(0)))
    return shapes


def auto_precision(model: nn.Module, device: str | torch.device = "cpu", int8: bool = False) -> str:
    """What ``precision: auto`` decodes ``model`` in on ``device``: on a CPU, fp32 or bf16
    (with ``int8``, ``precision: fastest``: or int8, each layer by its fastest int8 kernel),
    whichever multiplies a decoding step's layers (:func:`decoder_shapes`) faster as measured;
    the flags where nothing is measured (a GPU, ``TRANSFORMER_MEASURE=off``, a failure)."""
    if torch.device(hardware.resolve_device(device)).type != "cpu":
        return by_flags("auto", device)
    shapes = decoder_shapes(model)
    times = measured(shapes)
    if times is None:
        return by_flags("auto", device)
    cost = {p: sum(_float_kernel(times[f"{i}x{o}"], p)[1] for i, o in shapes) for p in ("fp32", "bf16")}
    if int8:
        cost["int8"] = sum(min(t for k, t in times[f"{i}x{o}"].items() if k in INT8_KERNELS) for i, o in shapes)
    return min(cost, key=cost.get)


def _float_kernel(times: dict[str, float], precision: str) -> tuple[str, float]:
    """The kernel a ``precision`` ("fp32" or "bf16") layer with these measured ``times``
    multiplies with, and its time: oneDNN's where it took at most :data:`ONEDNN_GAIN` of
    ``F.linear``'s, else ``F.linear`` (named by the precision); in bf16 then oneDNN's on the
    packed weight where it took at most :data:`PACKED_GAIN` of that one's."""
    kernel, best = precision, times[precision]
    onednn = times.get(ONEDNN[precision])
    if onednn is not None and onednn <= ONEDNN_GAIN * best:
        kernel, best = ONEDNN[precision], onednn
    packed = times.get(PACKED) if precision == "bf16" else None
    if packed is not None and packed <= PACKED_GAIN * best:
        kernel, best = PACKED, packed
    return kernel, best


def float_kernels(shapes, precision: str) -> dict[tuple[int, int], str]:
    """The kernel (:func:`_float_kernel`) of each of the (in, out) ``shapes`` that a
    ``precision`` ("fp32" or "bf16") decoding copy multiplies through oneDNN: its oneDNN name,
    or :data:`PACKED`; none where nothing is measured (``F.linear``, as before there was a choice)."""
    shapes = list(dict.fromkeys(shapes))
    times = measured(shapes) if precision in ONEDNN else None
    if times is None:
        return {}
    chosen = {(i, o): _float_kernel(times[f"{i}x{o}"], precision)[0] for i, o in shapes}
    return {shape: kernel for shape, kernel in chosen.items() if kernel != precision}


def onednn_shapes(shapes, precision: str) -> set[tuple[int, int]]:
    """Those of the (in, out) ``shapes`` that a ``precision`` decoding copy multiplies through
    oneDNN's linear, on a packed weight or not (:func:`float_kernels`)."""
    return set(float_kernels(shapes, precision))


def packed_shapes(shapes, precision: str) -> set[tuple[int, int]]:
    """Those of the (in, out) ``shapes`` that a ``precision`` decoding copy multiplies through
    oneDNN on a packed weight (:func:`float_kernels`; bf16 only)."""
    return {shape for shape, kernel in float_kernels(shapes, precision).items() if kernel == PACKED}


_KERNEL_NAMES = {**dict.fromkeys(ONEDNN.values(), "oneDNN"), PACKED: "oneDNN prepacked"}  # as `info` shows them


def int8_kernels(shapes) -> dict[tuple[int, int], str]:
    """The int8 kernel of each (in, out) in ``shapes``: the fastest measured, else by flags."""
    shapes = list(dict.fromkeys(shapes))
    times = measured(shapes)
    if times is None:
        return dict.fromkeys(shapes, by_flags("int8"))
    return {(i, o): min((k for k in times[f"{i}x{o}"] if k in INT8_KERNELS), key=times[f"{i}x{o}"].get)
            for i, o in shapes}


def report(model: nn.Module) -> dict[str, object]:
    """What decoding ``model`` on this CPU would choose, and from what: for ``transformer info``."""
    shapes = [*dict.fromkeys((m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)),
              *decoder_shapes(model)[-1:]]
    shapes = list(dict.fromkeys(shapes))
    times = measured(shapes)
    kernels = int8_kernels(shapes)
    return {"source": "flags" if times is None else "measured", "machine": hardware.describe_line(),
            "rows": list(ROWS), "auto": auto_precision(model, "cpu"),
            "shapes": [{"shape": f"{i}x{o}", "int8": kernels[i, o],
                        **{p: "F.linear" if times is None else _KERNEL_NAMES.get(_float_kernel(times[f"{i}x{o}"], p)[0],
                                                                                  "F.linear") for p in ONEDNN},
                        "seconds": None if times is None else {k: None if math.isinf(t) else t
                                                               for k, t in times[f"{i}x{o}"].items()}}
                       for i, o in shapes]}
