"""How to decode: one frozen config, validated once, shared by the Python API
(:class:`~transformer.inference.translator.Translator`, :class:`~transformer.inference.generator.Generator`),
every command and the service.

It is made of three parts, each a frozen dataclass of its own concern:

    SearchConfig    translation's search: beam size, length penalty, n-best, output length
    SamplingConfig  a language model's sampling: new tokens, temperature, top-k, top-p, seed
    RuntimeConfig   how the work runs: batch size, precision, device, compiled step

:class:`DecodingConfig` has the fields of all three, flat (``decoding.beam``; YAML's
``decoding:`` section and the command-line options name them the same way), and gives each
part back as :attr:`~DecodingConfig.search`, :attr:`~DecodingConfig.sampling` and
:attr:`~DecodingConfig.runtime`. This module imports nothing but the standard library, so
reading a config loads no model and no search.

A run may store the settings its recipe was tuned with (``decoding:`` in its config.yaml);
a command without flags decodes that way, and each flag overrides one field. Field names
are the command-line option names (``n_best`` is ``--n-best``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import shown
from ..frozen import TYPE_NAMES, Frozen, has_type, known_keys, part, whole_numbers_as_floats

# Decoding arithmetic (decode/precision.py): auto is bf16 where the device computes it
# natively, else fp32; int8 is a CPU option.
PRECISIONS = ("auto", "fastest", "fp32", "bf16", "int8")
# Whether a search runs the compiled step (front_door.py decides, compiled/ builds it): on builds it if missing, auto
# uses it when it is built already (or a generation is long enough to pay for building it).
COMPILE_CHOICES = ("auto", "on", "off")
# Source tokens (padded) a decoding batch holds when ``max_tokens`` is not set: MAX_TOKENS, and
# GPU_MAX_TOKENS for a translation on a GPU, which decodes a larger batch in about the time of
# a small one (on an H200, test2016 with beam 4 took 8.2 s in batches of 20,000 against 17.5 s
# in batches of 4,000: bf16, before decoding's GPU work; benchmarks/gpu/README.md). A language
# model's scoring keeps MAX_TOKENS everywhere: its logits (tokens x vocabulary) are the memory.
# (The front door sets them, inference/front_door.py; training's validation BLEU batches as it does.)
MAX_TOKENS = 4000
GPU_MAX_TOKENS = 20000
# How beam search divides a hypothesis's log-probability by its length (decode/scoring.py).
LENGTH_NORMS = ("gnmt", "length")
# The largest seed: torch's generators take up to 2**64 - 1, and sample n or row i of a batch
# samples with seed + n + i, so half of that leaves room for any number of them.
SEED_MAX = 2**63 - 1


def check_precision(precision: str, device: str = "cpu") -> None:
    """ValueError unless ``precision`` is one of :data:`PRECISIONS` and suits ``device``
    (int8 is a CPU decoding option)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {shown(precision)}")
    if precision == "int8" and str(device).split(":")[0] not in ("cpu", "auto"):
        raise ValueError(f"precision {precision} is for CPU decoding; use fp32 or bf16 with device {device}")


def _numbers(config, kind: type) -> None:
    """The number fields of ``kind`` in ``config`` checked for their type first (``beam: 2.5``
    was 'beam must be at least 1, got 2.5'); a whole number is a fine float (YAML and JSON
    give 1 for 1.0). The other fields' own checks name their choices."""
    whole_numbers_as_floats(config)
    for f in dataclasses.fields(kind):
        value = getattr(config, f.name)
        if f.type in ("int", "int | None", "float", "float | None") and not has_type(value, f.type):
            raise ValueError(f"{f.name} must be {TYPE_NAMES[f.type]}, got {shown(value)}")


def _need(ok: bool, name: str, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name} {what}, got {shown(value)}")


@dataclass(frozen=True)
class SearchConfig:
    """Translation: greedy search (beam 1) or beam search (decode/greedy.py, decode/beam.py)."""
    # ---- search (translation) ----
    beam: int = 4  # beam size; 1 = greedy search
    alpha: float = 0.6  # length penalty exponent: score / ((5 + len) / 6) ** alpha (length_norm gnmt)
    length_norm: str = "gnmt"  # gnmt: ((5 + len) / 6) ** alpha, as GNMT and the paper; length: len ** alpha, as Hugging Face and fairseq
    n_best: int = 1  # hypotheses returned per input, best first (at most beam)
    max_len_a: float = 1.0  # outputs stop at max_len_a * source length + max_len_b tokens
    max_len_b: int = 50  # the output length limit's constant term: max_len_a * source length + max_len_b tokens
    shortlist: bool = False  # project onto a vocabulary shortlist only: the target tokens that co-occur with the batch's source tokens in the training corpus, and the most frequent (the run's shortlist.safetensors, built from its corpus on first use); decode/shortlist.py

    def __post_init__(self) -> None:
        _numbers(self, SearchConfig)
        _need(isinstance(self.beam, int) and self.beam >= 1, "beam", "must be at least 1", self.beam)
        _need(isinstance(self.alpha, float) and math.isfinite(self.alpha), "alpha", "must be a finite number",
              self.alpha)
        _need(self.length_norm in LENGTH_NORMS, "length_norm", f"must be one of {', '.join(LENGTH_NORMS)}",
              self.length_norm)
        _need(isinstance(self.n_best, int) and 1 <= self.n_best <= self.beam, "n_best",
              f"must be between 1 and the beam size ({self.beam})", self.n_best)
        _need(isinstance(self.max_len_a, float) and self.max_len_a >= 0, "max_len_a", "must not be negative",
              self.max_len_a)
        _need(isinstance(self.max_len_b, int) and self.max_len_b >= 0, "max_len_b", "must not be negative",
              self.max_len_b)
        _need(isinstance(self.shortlist, bool), "shortlist", "must be true or false", self.shortlist)


@dataclass(frozen=True)
class SamplingConfig:
    """A language model's generation (decode/sample.py); temperature 0 is greedy."""
    # ---- sampling (generation; temperature 0 is greedy) ----
    max_new_tokens: int = 256  # tokens generated after the prompt
    temperature: float = 1.0  # sampling: logits are divided by it; 0 = greedy (the most probable token)
    top_k: int = 0  # sample among the k most probable tokens (0 = all)
    top_p: float = 1.0  # nucleus: the smallest set whose probability reaches top_p
    seed: int | None = None  # the same seed gives the same text

    def __post_init__(self) -> None:
        _numbers(self, SamplingConfig)
        _need(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "max_new_tokens",
              "must be at least 1", self.max_new_tokens)
        _need(isinstance(self.temperature, float) and 0 <= self.temperature < math.inf, "temperature",
              "must be a finite number, at least 0 (0 = greedy)", self.temperature)
        _need(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be at least 0 (0 = off)", self.top_k)
        _need(isinstance(self.top_p, float) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        _need(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed <= SEED_MAX), "seed",
              f"must be a non-negative integer, at most {SEED_MAX} (2**63 - 1)", self.seed)


@dataclass(frozen=True)
class RuntimeConfig:
    """How the work runs, for either kind of model."""
    # ---- how the work runs ----
    max_tokens: int | None = None  # source tokens per batch (padded); unset (null): 4000, or 20000 for a translation on a GPU (front_door.py)
    precision: str = "auto"  # auto (on a CPU fp32 or bf16, whichever measured faster there; on a GPU bf16 where native), fastest (auto with int8 allowed: fp32, bf16 or int8), fp32, bf16 or int8 (CPU); decode/precision.py, decode/choose.py
    device: str = "auto"  # auto (a CUDA GPU when there is one, else the CPU; the CPU for int8), cpu or cuda[:N]
    compile: str = "auto"  # on, off, auto: a compiled decoding step (on: built if missing; auto: if built); compiled/

    def __post_init__(self) -> None:
        _numbers(self, RuntimeConfig)
        _need(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1), "max_tokens",
              "must be positive", self.max_tokens)
        _need(isinstance(self.device, str), "device", "must be a device name such as cpu or cuda:0", self.device)
        _need(self.compile in COMPILE_CHOICES, "compile", f"must be one of {', '.join(COMPILE_CHOICES)}",
              self.compile)
        check_precision(self.precision, self.device)  # ValueError: "precision ..." names the field too


# (the fields come in the order search, sampling, runtime: dataclasses collect them from the
# last base class to the first)
@dataclass(frozen=True)
class DecodingConfig(RuntimeConfig, SamplingConfig, SearchConfig, Frozen):
    """Every decoding setting, flat: the fields of :class:`SearchConfig`,
    :class:`SamplingConfig` and :class:`RuntimeConfig`."""

    def __post_init__(self) -> None:
        for kind in (SearchConfig, SamplingConfig, RuntimeConfig):
            kind.__post_init__(self)  # each part checks its own fields

    search = part(SearchConfig)
    sampling = part(SamplingConfig)
    runtime = part(RuntimeConfig)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "decoding") -> "DecodingConfig":
        return cls(**known_keys(cls, d, f"{where}: unknown key(s) {{unknown}}; choose from {list(FIELDS)}"))


FIELDS = {f.name: f.default for f in dataclasses.fields(DecodingConfig)}
