"""What this machine computes fast, and the precision that suits it.

A bfloat16 matrix product runs 4-5x faster than a float32 one on a CPU with AVX512-BF16 or
AMX, and about 20x slower on one with AVX2 and FMA only (most laptops, Apple Silicon, AMD
EPYC before Zen 4), where torch emulates it. ``auto`` precision picks bf16 only where it is
computed natively, so the same config and the same command are fast on both.

The CPU is read from ``/proc/cpuinfo`` (its ``flags``) and from torch's own choice of
kernels, ``torch.backends.cpu.get_cpu_capability()``: bf16 counts as native only when torch
runs its AVX-512 kernels and the CPU has ``avx512_bf16`` or ``amx_bf16``. Setting torch's
``ATEN_CPU_CAPABILITY=avx2`` therefore makes an AMX machine choose as an AVX2 one would.

This module imports nothing of the package, so any layer may use it.
"""
from __future__ import annotations

import os
import platform
import sys
from functools import cache

import torch


#: the flags that decide speed here, in the order they are reported
FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni", "avx_vnni")
#: ``precision: auto`` (bf16 where it is native, else fp32) and ``--device auto`` (a CUDA GPU when there is one)
AUTO = "auto"


@cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) from /proc/cpuinfo; ("", empty) where there is none (macOS, Windows)."""
    name, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:  # Features: Linux on ARM
                    flags = frozenset(value.split())
                if name and flags:
                    break
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), flags


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where the OS does not list them)."""
    return _cpuinfo()[1]


def cpu_name() -> str:
    return _cpuinfo()[0]


def cpu_capability() -> str:
    """The vector instructions torch's own kernels use here: ``AVX512``, ``AVX2``, ``DEFAULT``..."""
    return torch.backends.cpu.get_cpu_capability()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX, with torch
    running its AVX-512 kernels); elsewhere bf16 is emulated and slower than fp32."""
    flags = cpu_flags()
    return cpu_capability().startswith("AVX512") and bool({"avx512_bf16", "amx_bf16"} & flags)


def cpu_has_vnni() -> bool:
    """Whether fbgemm sums int8 products here in 32 bits without saturating: its AVX512-VNNI
    kernels, so the CPU has AVX512-VNNI (AMX CPUs have it too), torch runs its AVX-512 kernels,
    and fbgemm is not told to stay below VNNI (``FBGEMM_ENABLE_INSTRUCTIONS``, as the AVX2
    stand-in does). Only there may fbgemm quantise activations to 8 bits, not 7: its AVX2 and
    plain AVX-512 kernels add int8 products in 16-bit pairs, which 8 bits can saturate."""
    limit = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper()
    if limit and "VNNI" not in limit:
        return False
    return cpu_capability().startswith("AVX512") and "avx512_vnni" in cpu_flags()


def resolve_device(name: str | torch.device) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA GPU (as Hugging Face's Trainer and nanoGPT
    choose), else ``cpu``; any other name is returned as it is."""
    if str(name) != AUTO:
        return str(name)
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_line(device: str | torch.device) -> str:
    """What a command says it runs on: ``cuda:0 (NVIDIA H200)``, or the CPU's name, the
    vector instructions torch uses and the threads (``cpu (AMD EPYC 9R14, AVX512, 2 threads)``)."""
    device = torch.device(resolve_device(device))
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    if device.type == "cpu":
        return f"cpu ({cpu_name()}, {cpu_capability()}, {torch.get_num_threads()} threads)"
    return str(device)


def device_problem(name: str) -> str | None:
    """Why ``name`` (a ``--device`` value) is not a device this process can compute on, in a
    few words that end with what to do; None when it is one (``auto`` always is). Checked by
    every command before anything big is loaded, so a wrong device is a one-line error, not
    torch's traceback."""
    if name == AUTO:
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return "not a device; expected auto, cpu, cuda or cuda:N"
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"{device.type} devices are not supported; expected auto, cpu, cuda or cuda:N"
    if not torch.cuda.is_available():
        return "no CUDA GPU is available here (torch.cuda.is_available() is False); use cpu"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
    return None


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes in bfloat16 natively: a CPU by :func:`cpu_has_native_bf16`,
    a CUDA GPU by torch's own check (Ampere and later); ``auto`` as :func:`resolve_device`."""
    device = torch.device(resolve_device(device))
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def resolve(precision: str, device: str | torch.device = "cpu") -> str:
    """``auto`` -> ``bf16`` where ``device`` computes it natively, else ``fp32``; any other
    name is returned as it is."""
    if precision != AUTO:
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def slow_precision_warning(precision: str, device: str | torch.device = "cpu") -> str | None:
    """One line for a user who asked for bf16 (or int8, or fp16) where ``device`` emulates
    it, saying what it costs and what ``auto`` picks; None where the choice is sound."""
    device = torch.device(resolve_device(device))
    if device.type != "cpu" or precision not in ("bf16", "fp16") or native_bf16(device):
        return None
    return (f"precision {precision}: this CPU ({cpu_capability()}, no avx512_bf16/amx_bf16) emulates "
            f"{precision} matrix products, about 20x slower than fp32; precision auto picks "
            f"{resolve(AUTO, device)} here")


def describe() -> dict[str, object]:
    """What a benchmark records about the machine it ran on."""
    flags = cpu_flags()
    return {
        "cpu": cpu_name(),
        "flags": [f for f in FLAGS_THAT_MATTER if f in flags],
        "capability": cpu_capability(),
        "native_bf16": cpu_has_native_bf16(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        **({"ATEN_CPU_CAPABILITY": os.environ["ATEN_CPU_CAPABILITY"]} if "ATEN_CPU_CAPABILITY" in os.environ else {}),
    }


def describe_line() -> str:
    """:func:`describe` as one line, for a benchmark's output and its table."""
    d = describe()
    return f"{d['cpu']}; {d['capability']}; flags {' '.join(d['flags']) or 'none'}; {d['threads']} threads; torch {d['torch']}"
