"""Compiled decoding on a fixed-shape cache: one decoding step, compiled by ``torch.compile``
and reused for every step of a search (language-model generation, greedy and beam search).

The cache of ``model.decode`` is rebuilt every step (one position longer, concatenated),
and finished rows leave it. A :class:`~transformer.model.cache.StaticKVCache` has its final
size from the start (``capacity`` positions, written in place; finished rows stay, unread,
until a search drops them at a bucket boundary, when half its rows are done), so the only
size that changes from step to step is the number of slots written so far, which the
compiled graph takes as a symbolic size: one graph serves every step of every search
(``dynamic=True``: batch, source length and capacity are symbolic too). On a CPU, inductor
turns the step into generated C++ loops and matrix products on prepacked weights
(``freezing``: the weights are constants of the graph), called from generated C++, which
removes much of the per-operator cost that dominates a small model's step in eager mode;
each product is inductor's own C++ GEMM template or aten's, whichever was faster when timed
at compile time (:data:`INDUCTOR_OPTIONS`).

The eager path is the reference: the compiled step computes the same function, and the
tests compare logits and tokens. Compiling takes tens of seconds, in every new process (the
prepacked weights keep the graph out of inductor's on-disk cache; only its C++ kernels are
reused), and it saves a few milliseconds a step whatever the batch, so it pays for very long
generations and for a process that decodes again and again (a server, a loop in Python),
not for one ordinary command: ``compile="auto"`` compiles a generation of at least
:data:`AUTO_MIN_STEPS` new tokens; translation compiles when asked (``--compile on``).
Measured in ``benchmarks/lm/README.md`` and ``benchmarks/decode/README.md``.
"""
from __future__ import annotations

import types
import warnings
import weakref

import torch
from torch import nn

from .common import next_token_logprobs

COMPILE_CHOICES = ("auto", "on", "off")
# compile="auto" compiles a generation of at least this many new tokens (steps: a step's
# saving hardly depends on the batch). Measured on 2 cores (benchmarks/lm/README.md): the
# compilation cost 47-95 s and saved 1.9-4.3 ms a step, so it paid after 17,000-30,000 steps.
AUTO_MIN_STEPS = 32768
# graphs of a model's step kept at once (torch's default is 8; a translation model can need
# that many: the first step or a later one, sources with or without padding, greedy or beam)
RECOMPILE_LIMIT = 64

# How inductor builds the step (measured in benchmarks/lm/README.md):
INDUCTOR_OPTIONS = dict(
    # the weights are constants of the graph, so each linear layer is one prepacked product
    freezing=True,
    # the graph's kernels are called from generated C++, not from a Python function
    cpp_wrapper=True,
    # each matrix product may be inductor's own C++ template (AMX tiles for bf16 weights)
    # instead of a oneDNN or aten call, whose fixed cost is most of a product of a few rows:
    # both are timed once, at compile time, and the faster is kept (with the graph, in
    # inductor's cache folder); aten stays a candidate, for the products the template
    # does not take
    max_autotune_gemm=True,
    max_autotune_gemm_backends="CPP,ATEN",
    # nothing of that timing on stderr (a generation's text may be read from the terminal)
    autotune_num_choices_displayed=0,
    max_autotune_report_choices_stats=False,
)

_compiled: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, dict]]" = weakref.WeakKeyDictionary()


def compiled_step(model: nn.Module, logprobs: bool = False):
    """``model.step_slots`` compiled by torch.compile (built on first use and kept with the
    model), with the weights frozen into the graph as constants. If the weights change
    afterwards (in place, as an optimizer does, or replaced), the next call compiles afresh.

    ``logprobs``: the step returns :func:`~transformer.decode.common.next_token_logprobs`
    of its logits (float32, PAD and BOS impossible), computed in the same graph: one fused
    pass where eager search casts, normalises and masks the (B, V) logits in three (what
    greedy and beam search read; sampling reads the logits)."""
    version = _weights_version(model)
    held = _compiled.get(model)
    if held is None or held[0] != version:
        # (a changed model gets new copies of the code, so its old graphs, which hold the old
        # weights, are never matched again, and leave with their code)
        held = _compiled[model] = (version, {})
    if logprobs in held[1]:
        return held[1][logprobs]
    # dynamic: the sizes that change (the slots written so far, step after step; the batch,
    # source length and capacity, search after search) are symbolic in the one graph
    # (the limit counts the model's graphs)
    fn = _logprob_step if logprobs else type(model).step_slots
    compiled = torch.compile(_own_copy(fn), fullgraph=True, dynamic=True, backend=_inductor,
                             recompile_limit=RECOMPILE_LIMIT, options={"guard_filter_fn": _guards_on_inputs})
    owner = weakref.ref(model)  # the entry must not keep its own key (the model) alive
    # dynamo reads `freezing` while it traces (weights as constants); the rest of the options
    # apply in the backend. One patch object for every call (building one costs a class).
    freezing = torch._inductor.config.patch(freezing=INDUCTOR_OPTIONS["freezing"])

    def step(*args):
        with freezing:
            return compiled(owner(), *args)

    held[1][logprobs] = step
    return step


def _logprob_step(self, *args):
    """The step's next-token log-probabilities: ``next_token_logprobs(step_slots(...))``."""
    return next_token_logprobs(self.step_slots(*args), self.cfg)


def _inductor(graph, example_inputs):
    """torch.compile's backend: inductor with :data:`INDUCTOR_OPTIONS`, applied while it
    compiles a graph (the first call at a new shape), not around every call of the step
    (a patch of inductor's config costs 0.2-0.5 ms)."""
    from torch._inductor.compile_fx import compile_fx

    with torch._inductor.config.patch(INDUCTOR_OPTIONS), warnings.catch_warnings():
        # inductor's GEMM timing calls a deprecated storage method of torch's own
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
        return compile_fx(graph, example_inputs)


def _weights_version(model: nn.Module) -> tuple[int, ...]:
    """Changes when a parameter or buffer is modified in place or replaced, or the model
    switches between training and eval mode."""
    return (int(model.training), *(x for t in (*model.parameters(), *model.buffers()) for x in (id(t), t._version)))


def _own_copy(fn):
    """``fn`` with a code object of its own. Dynamo keeps its compiled graphs on the code
    object, so a copy per model keeps each model's graphs (which hold its frozen weights, and
    do not guard on the model: see below) from ever being matched by another model's calls."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _guards_on_inputs(entries) -> list[bool]:
    """Which of dynamo's guards the compiled step keeps: those on its inputs (the tokens and
    the cache's tensors: their shapes, dtypes and layout), not the hundreds on the model's
    modules and weights (types, ids, attribute values), whose checks took a third of a
    batch-1 step. What those guarded is checked once per search instead: each model has its
    own compiled step (:func:`_own_copy`), and :func:`_weights_version` compiles afresh when
    a weight or the training mode changes. (The config is frozen; a module's other
    attributes, changed by hand after a compilation, are not seen.)"""
    return [not entry.name.startswith("self") for entry in entries]


def should_compile(compile: str | bool, new_tokens: int) -> bool:
    """Whether a generation of ``new_tokens`` steps runs the compiled step: ``on`` / True
    always, ``off`` / False never, ``auto`` when it is long enough to pay for the compilation."""
    if isinstance(compile, bool):
        return compile
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {compile!r}")
    return compile == "on" or (compile == "auto" and new_tokens >= AUTO_MIN_STEPS)


def shrinks(live: int, rows: int) -> bool:
    """Whether a compiled search drops its finished rows now (or, with beams, its finished
    sentences' groups): when half or fewer of its ``rows`` are still decoding, so that a
    search runs at a few batch sizes only; never down to one, which torch.compile would
    compile as a graph of its own."""
    return 2 <= live <= rows // 2


def cache_capacity(longest_prompt: int, new_tokens: int, max_len: int) -> int:
    """The positions a search's fixed-shape cache holds: enough for the longest prompt and
    every new token, rounded up to a multiple of 64 (fewer distinct buffer sizes), and never
    more than ``max_len``."""
    need = longest_prompt + new_tokens
    return min(max_len, -(-need // 64) * 64)
