"""What the model needs inside a graph that ``torch.compile`` or ``torch.export`` traces,
applied by the code that compiles instead of being chosen inside the model's layers.

    import transformer.compiling        # torch.compile then traces the forms below (dynamo)
    compiled = torch.compile(model)     # training's compile: true, anyone's torch.compile
    with traced():                      # torch.export (non-strict: it runs the Python as it is)
        program = torch.export.export(module, args)   # decode/aot.py's steps

Five of the model's functions have a form for a traced graph. ``torch.compile`` (dynamo)
traces that form wherever it meets the function once this module is imported
(``torch.compiler.substitute_in_graph``); inside :func:`traced` the functions themselves are
replaced (and put back after), for ``torch.export``:

- ``masks.hides_any``: the eager code reads on the host whether a mask hides anything, to
  skip work that would change nothing (a mask on an unpadded batch, zeroing the weights of
  fully masked rows). A graph cannot branch on data: every mask is applied.
- ``embedding.position_end``: the eager code checks that positions fit the model's tables;
  a graph cannot read them, so the check is the eager code's only.
- ``attention._fused_pays``: on a CPU, inductor fuses the mask, softmax and sums of the
  explicit matmul-softmax-matmul into its own loops, so that is traced, not torch's fused
  kernel.
- ``dropout.dropout_mask``: dynamo cannot trace the eager mask's in-place ``random_``; the
  mask comes from ``torch.rand``, which inductor draws inside the fused kernel, seeded from
  torch's generator (a compiled run drops other elements than an eager one with the same seed).
- ``embedding.lookup``: its gradient is torch's own embedding backward, kept out of the
  generated code as an opaque op (``transformer::embedding_grad``). Inductor writes it as a
  scatter-add with atomic updates, which on a CPU is 7-14 times slower than torch's kernel
  when many tokens hit few rows (nanoGPT's recipe: 768 characters into 65 rows, 6% of a
  compiled update). Without a gradient to take (decoding, an exported step) it is the plain
  lookup.

:func:`traced` replaces module attributes: they hold for every thread while the block runs.
"""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .model import dropout, embedding, masks

attention = importlib.import_module(f"{__package__}.model.attention")  # (the package's `attention` is the function)


def _hides_any(mask: Tensor) -> bool:  # noqa: ARG001
    return True


def _position_end(positions: Tensor) -> int:  # noqa: ARG001
    return 0


def _fused_pays(q: Tensor) -> bool:
    return q.device.type != "cpu"


def _dropout_mask(shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    return (torch.rand(shape, device=device) >= p).to(dtype) * (1.0 / (1.0 - p))


def _lookup(ids: Tensor, weight: Tensor) -> Tensor:
    if torch.is_grad_enabled() and weight.requires_grad:
        return _Lookup.apply(ids, weight)
    return nn.functional.embedding(ids, weight)


@torch.library.custom_op("transformer::embedding_grad", mutates_args=())
def embedding_grad(grad: Tensor, ids: Tensor, rows: int) -> Tensor:
    """d(weight[ids]) / d(weight) applied to ``grad``: (rows, C), the sum of ``grad``'s
    vectors per id."""
    return torch.ops.aten.embedding_dense_backward(grad, ids, rows, -1, False)


@embedding_grad.register_fake
def _(grad: Tensor, ids: Tensor, rows: int) -> Tensor:
    return grad.new_empty(rows, grad.shape[-1])


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ids: Tensor, weight: Tensor) -> Tensor:
        return nn.functional.embedding(ids, weight)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # noqa: ARG004
        ids, weight = inputs
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]

    @staticmethod
    def backward(ctx, grad: Tensor):
        (ids,) = ctx.saved_tensors
        return None, embedding_grad(grad.contiguous(), ids, ctx.rows)


_REPLACED = ((masks, "hides_any", _hides_any), (embedding, "position_end", _position_end),
             (attention, "_fused_pays", _fused_pays), (dropout, "dropout_mask", _dropout_mask),
             (embedding, "lookup", _lookup))

for _module, _name, _graph_form in _REPLACED:
    torch.compiler.substitute_in_graph(getattr(_module, _name))(_graph_form)


@contextlib.contextmanager
def traced() -> Iterator[None]:
    """The model as a traced graph needs it (see the module's docstring), until the block ends."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in _REPLACED]
    try:
        for module, name, replacement in _REPLACED:
            setattr(module, name, replacement)
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
