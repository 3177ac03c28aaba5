"""Training's ``torch.compile`` (``compile: true``): the forward pass and the loss of a language
model's windows compiled as one graph (its backward one graph too), ``fullgraph=True``, so that
a graph break is an error instead of a silent fall back to Python.

The model's eager code reads nothing on the host in a training forward, but three of its parts
take another form inside a graph. :func:`compiled_training` gives the model being trained
those forms (subclasses of its own modules, which outside a graph are their eager selves:
validation, checkpoints and decoding see the model as it always was):

- ``Dropout``: the eager mask's in-place ``random_`` cannot be traced; in a graph the mask comes
  from ``torch.rand``, which inductor draws inside the fused kernel, seeded from torch's
  generator (a compiled run drops other elements than an eager one with the same seed).
- attention: on a CPU the matmul-softmax-matmul, which inductor fuses into its own loops,
  rather than torch's fused kernel (:func:`~transformer.kernels.attention.graph_attention`), its
  dropout drawn as above; on a GPU torch's fused kernel, with ``is_causal=True`` where only
  the future is masked (a language model's windows), so that it may pick the flash kernel.
- the embedding lookups: their gradient is torch's own embedding backward, kept out of the
  generated code as an opaque op (``transformer::embedding_grad``). Inductor writes it as a
  scatter-add with atomic updates, which on a CPU is 7-14 times slower than torch's kernel
  when many tokens hit few rows (nanoGPT's recipe: 768 characters into 65 rows, 6% of a
  compiled update).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..kernels.attention import graph_attention
from ..model.attention import MultiHeadAttention, attention
from ..model.dropout import Dropout
from ..model.embedding import LearnedPositions, TokenEmbedding
from ..run.private import use_private_build_folder
from .update import forward_loss


def compiled_training(model: nn.Module, wrapper: nn.Module | None, cpu: bool):
    """The forward and loss function that ``train_step`` runs (see
    :meth:`~transformer.train.trainer.Trainer`), compiled, after ``model`` (in place) has its
    graph forms. One process: ``forward_loss`` (the model's forward and the loss) compiled with
    ``fullgraph=True``; under DDP (``wrapper``) the wrapper's forward is compiled, which DDP
    splits at its gradient buckets, and the loss stays eager, outside the wrapper as DDP requires."""
    for module in model.modules():
        if type(module) in GRAPH_FORMS:
            module.__class__ = GRAPH_FORMS[type(module)]
    use_private_build_folder()  # the code inductor generates and loads: never a shared folder
    # CPU: the graphs' calls in C++ rather than Python (1.08x an update, nanoGPT's recipe in bf16)
    options = {"cpp_wrapper": True} if cpu else None
    if wrapper is not None:
        return torch.compile(wrapper, dynamic=False, options=options), forward_loss
    return None, torch.compile(forward_loss, dynamic=False, fullgraph=True, options=options)


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


def lookup(ids: Tensor, weight: Tensor) -> Tensor:
    """``weight[ids]``, its gradient (when one is taken) torch's embedding backward as one op."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return _Lookup.apply(ids, weight)
    return nn.functional.embedding(ids, weight)


class GraphDropout(Dropout):
    def forward(self, x: Tensor) -> Tensor:
        if not (torch.compiler.is_compiling() and self.training and self.p > 0.0):
            return super().forward(x)
        return x * ((torch.rand(x.shape, device=x.device) >= self.p).to(x.dtype) * (1.0 / (1.0 - self.p)))


class GraphAttention(MultiHeadAttention):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               need_weights: bool = False, kernel=attention) -> tuple[Tensor, Tensor | None]:
        if not torch.compiler.is_compiling() or need_weights or kernel is not attention:
            return super().attend(q, k, v, mask, need_weights, kernel)
        k, v = self.expand_kv(k, v)  # (B, H, T_k, D)
        out = graph_attention(q, k, v, mask, self.attn_dropout if self.training else 0.0)
        return self.out_proj(self.merge_heads(out)), None


class GraphTokenEmbedding(TokenEmbedding):
    def forward(self, tokens: Tensor) -> Tensor:
        if not torch.compiler.is_compiling():
            return super().forward(tokens)
        return lookup(tokens, self.weight) * self.scale


class GraphLearnedPositions(LearnedPositions):
    def at(self, x: Tensor, positions: Tensor) -> Tensor:
        if not torch.compiler.is_compiling():
            return super().at(x, positions)
        return x + lookup(positions, self.weight).to(x.dtype)


# each module of the model -> its form in a graph
GRAPH_FORMS = {Dropout: GraphDropout, MultiHeadAttention: GraphAttention, TokenEmbedding: GraphTokenEmbedding,
               LearnedPositions: GraphLearnedPositions}
