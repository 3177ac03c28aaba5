"""The trace: one forward pass of either model kind that keeps every intermediate value under
a stable name, and replaces any of them on the way (ablation, patching).

    values = trace_translation(model, src, tgt_in)            # (B, S), (B, T) ids
    values = trace_lm(model, tokens)                          # (B, T) ids
    values["dec.1.cross.head_out"]                            # (B, T, H, D)
    trace_lm(model, tokens, replace={"dec.0.attn.head_out": Patch(zero, heads=[3])})

It runs the model's own parts (embeddings, ``project_qkv`` / ``q_proj``, ``apply_rotary``,
``expand_kv``, the pure :func:`~transformer.model.attention.attention`, ``merge_heads``,
``out_proj``, ``FeedForward.hidden`` and ``fc2``, ``project``) in the order of
``Transformer.forward`` / ``LanguageModel.forward``. Each layer is the layer's own wiring
(``EncoderLayer.sublayers`` / ``DecoderLayer.sublayers``: residual connections and norms)
given the trace's sub-layers, with the recorder as its ``tap``; only the stacks' loops and
the embeddings are written here. Attention calls the kernel the model calls (torch's fused one
where the model uses it), so a trace without replacements gives the forward pass's logits bit
for bit; the weights it keeps are computed beside it by ``attention_weights``.
``attention="explicit"`` computes each head's output from those weights (the model's
``need_weights`` path, as the walkthrough shows it). The plain forward pass records nothing:
its tap passes every value as it is.

Names (layers counted from 0; ``s`` is the stack, ``enc`` or ``dec``; a language model has
only ``dec``). Shapes: B rows, T positions of the stack, S source positions, H heads, H_kv
key/value heads, D head size, C d_model, F the FFN's width, V the vocabulary::

    s.embed                  (B, T, C)   the token embeddings (scaled as the model scales them)
    s.pos                    (B, T, C)   the position vectors added (absent under RoPE)
    s.L.resid_pre            (B, T, C)   layer L's input (the residual stream)
    s.L.attn.in              (B, T, C)   the self-attention's input (pre-norm: after the norm)
    s.L.attn.q               (B, H, T, D)   queries (RoPE: turned)
    s.L.attn.k, s.L.attn.v   (B, H_kv, T, D) keys (RoPE: turned) and values
    s.L.attn.weights         (B, H, T, T)   softmax(Q K^T / sqrt(D) + M)
    s.L.attn.head_out        (B, T, H, D)   each head's output, before W_O
    s.L.attn.out             (B, T, C)   after W_O
    s.L.attn.sum             (B, T, C)   the residual sum x + out (post-norm: before the norm)
    s.L.resid_mid            (B, T, C)   after the self-attention sub-layer
    dec.L.cross.{in, q, k, v, weights, head_out, out, sum}   the same for cross-attention
                                         (translation only; k, v (B, H, S, D), weights (B, H, T, S))
    dec.L.resid_cross        (B, T, C)   after the cross-attention sub-layer
    s.L.ffn.in               (B, T, C)   the FFN's input
    s.L.ffn.hidden           (B, T, F)   after the activation (gated: up * silu(gate))
    s.L.ffn.out, s.L.ffn.sum (B, T, C)
    s.L.resid_post           (B, T, C)   layer L's output
    s.final_norm             (B, T, C)   after the stack's final norm (models that have one)
    memory                   (B, S, C)   the encoder's output, what cross-attention reads (translation)
    logits                   (B, T, V)   (B, N, V) at the positions ``logits_at`` names

A replacement (``replace={name: R}``) is a tensor (broadcast to the value's shape), a function
of the value returning its replacement, or a :class:`Patch` that restricts either to some
positions and heads. What follows the value in the pass reads the replacement.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from ..model import masks
from ..model.attention import attention, attention_weights
from ..model.rotary import apply_rotary

__all__ = ["Patch", "Resume", "trace_translation", "trace_lm", "trace", "value_names", "zero", "batch_mean",
           "position_mean"]

SUBLAYER_VALUES = ("in", "q", "k", "v", "weights", "head_out", "out", "sum")
HEAD_FIRST = ("q", "k", "v", "weights")  # (B, H, T, .): positions on dim 2, heads on dim 1


@dataclass(frozen=True)
class Patch:
    """A replacement for some positions and heads only. ``value``: a tensor broadcastable to the
    value's shape, or a function of the value returning one; ``positions`` / ``heads``: indices
    (None: all). ``heads`` needs a per-head value (``q``, ``k``, ``v``, ``weights``,
    ``head_out``); ``positions`` are the query positions of ``weights``."""

    value: Tensor | Callable[[Tensor], Tensor]
    positions: Sequence[int] | None = None
    heads: Sequence[int] | None = None


Replacement = Tensor | Callable[[Tensor], Tensor] | Patch


@dataclass(frozen=True)
class Resume:
    """Start a trace at layer ``layer`` of stack ``stack`` ("enc", "dec") from ``values``, a
    trace of the same inputs with one row that kept ``{stack}.{layer}.resid_pre`` (and, to
    resume a translation model's decoder, ``memory``): what comes before is not computed again
    (it is the same in every row), and each row starts from those values. Replacements must
    name values from that point on. (Head analysis: a head of layer 4 changes nothing before it.)"""

    stack: str
    layer: int
    values: dict[str, Tensor]

    def names(self, names: list[str]) -> list[str]:
        """The names of ``names`` (a model's, in order) from this point on."""
        return names[names.index(f"{self.stack}.{self.layer}.resid_pre"):]

    def take(self, name: str, rows: int) -> Tensor:
        value = self.values[name]
        return value.expand(rows, *value.shape[1:])


def zero(value: Tensor) -> Tensor:
    """Zero ablation: ``replace={name: zero}``."""
    return torch.zeros_like(value)


def batch_mean(value: Tensor) -> Tensor:
    """The value's mean over the batch, in every row (mean ablation over a batch of inputs)."""
    return value.mean(0, keepdim=True).expand_as(value)


def position_mean(value: Tensor) -> Tensor:
    """The value's mean over the positions, at every position: dim 1 of a (B, T, ...) value
    (``head_out`` and the (B, T, C) values; not ``q``, ``k``, ``v``, ``weights``)."""
    return value.mean(1, keepdim=True).expand_as(value)


def value_names(model) -> list[str]:
    """Every name a trace of ``model`` can hold, in the order of the forward pass (``s.pos``
    only where the model adds position vectors, ``*.final_norm`` where it has the norm)."""
    cfg = model.cfg
    names = []

    def stack(s: str, n_layers: int, pos: bool, norm, cross: bool) -> None:
        names.extend([f"{s}.embed", *([f"{s}.pos"] if pos else [])])
        for i in range(n_layers):
            p = f"{s}.{i}"
            names.append(f"{p}.resid_pre")
            names.extend(f"{p}.attn.{v}" for v in SUBLAYER_VALUES)
            names.append(f"{p}.resid_mid")
            if cross:
                names.extend(f"{p}.cross.{v}" for v in SUBLAYER_VALUES)
                names.append(f"{p}.resid_cross")
            names.extend(f"{p}.ffn.{v}" for v in ("in", "hidden", "out", "sum"))
            names.append(f"{p}.resid_post")
        if norm is not None:
            names.append(f"{s}.final_norm")

    if cfg.decoder_only:
        stack("dec", len(model.decoder.layers), model.positions is not None, model.decoder.norm, cross=False)
    else:
        stack("enc", len(model.encoder.layers), True, model.encoder.norm, cross=False)
        names.append("memory")
        stack("dec", len(model.decoder.layers), True, model.decoder.norm, cross=True)
    return [*names, "logits"]


class Recorder:
    """Keeps the values ``keep`` asks for and applies the replacements, name by name."""

    def __init__(self, names: list[str], replace: dict[str, Replacement] | None,
                 keep: Callable[[str], bool] | Iterable[str] | None) -> None:
        replace = dict(replace or {})
        unknown = sorted(set(replace) - set(names))
        if unknown:
            raise ValueError(f"no value named {', '.join(unknown)} in this model's trace "
                             f"(names like {names[1]!r}, {names[4]!r}, 'logits'; see value_names(model))")
        self.replace = replace
        if keep is None:
            self.keeps = lambda name: True
        elif callable(keep):
            self.keeps = keep
        else:
            wanted = set(keep)
            missing = sorted(wanted - set(names))
            if missing:
                raise ValueError(f"no value named {', '.join(missing)} in this model's trace")
            self.keeps = wanted.__contains__
        self.values: dict[str, Tensor] = {}

    def replaces(self, name: str) -> bool:
        return name in self.replace

    def __call__(self, name: str, value: Tensor) -> Tensor:
        r = self.replace.get(name)
        if r is not None:
            value = _replaced(name, value, r)
        if self.keeps(name):
            self.values[name] = value
        return value


def _replaced(name: str, value: Tensor, r: Replacement) -> Tensor:
    patch = r if isinstance(r, Patch) else Patch(r)
    new = patch.value(value) if callable(patch.value) else patch.value
    new = torch.as_tensor(new, dtype=value.dtype, device=value.device)
    try:
        new = new.expand_as(value)
    except RuntimeError:
        raise ValueError(f"{name}: the replacement's shape {tuple(new.shape)} does not fit the value's "
                         f"{tuple(value.shape)}") from None
    if patch.positions is None and patch.heads is None:
        return new
    what = name.rsplit(".", 1)[-1]
    per_head = what in (*HEAD_FIRST, "head_out")
    pos_dim, head_dim = (2, 1) if what in HEAD_FIRST else (1, 2)
    chosen = torch.ones((), dtype=torch.bool, device=value.device)
    for picked, dim, label in ((patch.positions, pos_dim, "position"), (patch.heads, head_dim, "head")):
        if picked is None:
            continue
        if label == "head" and not per_head:
            raise ValueError(f"{name} has no heads; Patch(heads=...) needs q, k, v, weights or head_out")
        n = value.size(dim)
        bad = [i for i in picked if not -n <= int(i) < n]
        if bad:
            raise ValueError(f"{name}: {label} {bad[0]} is out of range (the value has {n}, 0..{n - 1})")
        flags = torch.zeros(n, dtype=torch.bool, device=value.device)
        flags[torch.as_tensor(list(picked), dtype=torch.long, device=value.device)] = True
        shape = [1] * value.dim()
        shape[dim] = n
        chosen = chosen & flags.view(shape)
    return torch.where(chosen, new, value)


# ---- one layer --------------------------------------------------------------------------------

def _attend(rec: Recorder, p: str, mha, q: Tensor, k: Tensor, v: Tensor, mask, explicit: bool) -> Tensor:
    """MultiHeadAttention.attend on projected q (B, H, T_q, D), k, v (B, H_kv, T_k, D), keeping
    ``p``.q / k / v / weights / head_out / out. Returns the output (B, T_q, C)."""
    q, k, v = rec(f"{p}.q", q), rec(f"{p}.k", k), rec(f"{p}.v", v)
    k, v = mha.expand_kv(k, v)  # (B, H, T_k, D)
    weights_name = f"{p}.weights"
    if explicit or rec.replaces(weights_name):
        heads, weights = attention(q, k, v, mask, need_weights=True)  # (B, H, T_q, D), (B, H, T_q, T_k)
        changed = rec(weights_name, weights)
        if changed is not weights:
            heads = changed @ v
    else:
        heads, _ = attention(q, k, v, mask)  # the kernel the model's own forward pass calls
        if rec.keeps(weights_name):
            rec(weights_name, attention_weights(q, k, mask))
    head_out = rec(f"{p}.head_out", heads.transpose(1, 2))  # (B, T_q, H, D)
    return rec(f"{p}.out", mha.out_proj(mha.merge_heads(head_out.transpose(1, 2))))


def run_layer(rec: Recorder, p: str, layer, x: Tensor, self_mask, rotary=None, cross_kv=None, memory_mask=None,
              explicit: bool = False) -> Tensor:
    """EncoderLayer.forward or DecoderLayer.forward (no cache) on x (B, T, C), named ``p``
    ("enc.3"): the layer's own wiring (its ``sublayers``) with sub-layers that keep their
    values, ``rec`` as its tap. ``cross_kv``: a translation decoder layer's K, V (B, H, S, D)."""

    def attend_self(h: Tensor):
        q, k, v = layer.self_attn.project_qkv(h)  # (B, H, T, D); K, V (B, H_kv, T, D)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return _attend(rec, f"{p}.attn", layer.self_attn, q, k, v, self_mask, explicit), None

    def attend_memory(h: Tensor):
        mha = layer.cross_attn
        return _attend(rec, f"{p}.cross", mha, mha.split_heads(mha.q_proj(h)), *cross_kv, memory_mask, explicit), None

    def feed_forward(h: Tensor):
        return rec(f"{p}.ffn.out", layer.ffn.fc2(rec(f"{p}.ffn.hidden", layer.ffn.hidden(h)))), None

    cross = {} if cross_kv is None else {"cross_attention": attend_memory}
    return layer.sublayers(x, attend_self, feed_forward=feed_forward, tap=lambda name, value: rec(f"{p}.{name}", value),
                           **cross)[0]


def run_stack(rec: Recorder, s: str, stack, x: Tensor, self_mask, rotary=None, cross_kv=None, memory_mask=None,
              explicit: bool = False, start: int = 0) -> Tensor:
    """Encoder.forward / Decoder.forward's loop and final norm, named ``s`` ("enc", "dec");
    ``x`` is layer ``start``'s input."""
    for i, layer in enumerate(stack.layers):
        if i < start:
            continue
        x = run_layer(rec, f"{s}.{i}", layer, x, self_mask, rotary, None if cross_kv is None else cross_kv[i],
                      memory_mask, explicit)
    if stack.norm is not None:
        x = rec(f"{s}.final_norm", stack.norm(x))
    return x


def _logits(rec: Recorder, model, h: Tensor, logits_at) -> Tensor:
    if logits_at is not None:
        h = h[:, torch.as_tensor(list(logits_at), dtype=torch.long, device=h.device)]
    return rec("logits", model.project(h))


def _check_eval(model) -> None:
    if model.training:
        raise ValueError("trace a model in eval mode (model.eval()): dropout would change every value")


# ---- the two model kinds ---------------------------------------------------------------------

@torch.no_grad()
def trace_translation(model, src: Tensor, tgt: Tensor, *, replace: dict[str, Replacement] | None = None,
                      keep: Callable[[str], bool] | Iterable[str] | None = None, logits_at: Sequence[int] | None = None,
                      attention: str = "model", resume: Resume | None = None) -> dict[str, Tensor]:
    """``Transformer.forward(src, tgt)`` (teacher forcing), every value kept.

    Args:
        src: (B, S) source ids (right-padded with ``pad_id``); tgt: (B, T) decoder input
            (BOS + target).
        replace: {name: tensor, function of the value, or :class:`Patch`}.
        keep: the names to keep (an iterable, or a predicate on the name); None: all.
        logits_at: the target positions to project to logits (None: all).
        attention: "model" (the model's kernel, bit-exact with the forward pass) or "explicit"
            (softmax weights times V, as ``return_weights=True`` computes it).
        resume: start partway, from a one-row trace of the same inputs (:class:`Resume`).

    Returns:
        {name: tensor} in the order of the forward pass (module docstring).
    """
    _check_eval(model)
    names = value_names(model)
    rec = Recorder(names if resume is None else resume.names(names), replace, keep)
    explicit = _explicit(attention)
    rows = src.size(0)
    mask = model.src_mask(src)
    padded = not bool(mask.all())
    if resume is not None and resume.stack == "dec":
        one = model.start_cache(resume.values["memory"], src[:1], padded)  # cross K, V projected once, for every row
        cross = tuple((k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in one.cross_kv)
        cache = dataclasses.replace(one, cross_kv=cross, memory_mask=mask)
    else:
        if resume is None:
            x = rec("enc.embed", model.src_embed(src))
            x = model.dropout(x + rec("enc.pos", _sinusoids(model, x)))
        else:
            x = resume.take(f"enc.{resume.layer}.resid_pre", rows)
        memory = rec("memory", run_stack(rec, "enc", model.encoder, x, mask if padded else None, explicit=explicit,
                                         start=0 if resume is None else resume.layer))
        cache = model.start_cache(memory, src, padded)
    if resume is not None and resume.stack == "dec":
        y = resume.take(f"dec.{resume.layer}.resid_pre", rows)
    else:
        y = rec("dec.embed", model.tgt_embed(tgt))
        y = model.dropout(y + rec("dec.pos", _sinusoids(model, y)))
    self_mask = cache.self_mask(y.size(1), None, y.device)
    h = run_stack(rec, "dec", model.decoder, y, self_mask, cross_kv=cache.cross_kv, memory_mask=cache.attend_mask,
                  explicit=explicit, start=resume.layer if resume is not None and resume.stack == "dec" else 0)
    _logits(rec, model, h, logits_at)
    return rec.values


@torch.no_grad()
def trace_lm(model, tokens: Tensor, *, real: Tensor | None = None, replace: dict[str, Replacement] | None = None,
             keep: Callable[[str], bool] | Iterable[str] | None = None, logits_at: Sequence[int] | None = None,
             attention: str = "model", resume: Resume | None = None) -> dict[str, Tensor]:
    """``LanguageModel.forward(tokens)``, every value kept (arguments as in
    :func:`trace_translation`; ``tokens`` (B, T) left-padded, ``real`` as in the model's
    ``decode``). ValueError when the tokens do not fit the model's ``max_len``."""
    from ..model.embedding import check_length
    from ..model.lm import next_positions

    _check_eval(model)
    names = value_names(model)
    rec = Recorder(names if resume is None else resume.names(names), replace, keep)
    explicit = _explicit(attention)
    real = tokens != model.cfg.pad_id if real is None else real
    key_mask = None if bool(real.all()) else masks.extend_real_keys(None, real, 0)
    positions = next_positions(torch.zeros(tokens.size(0), dtype=torch.long, device=tokens.device), real)
    check_length(int(positions.max()) + 1 if positions.numel() else 0, model.cfg.max_len)
    if resume is None:
        x = rec("dec.embed", model.embed(tokens))
        if model.positions is not None:  # LearnedPositions.at / PositionalEncoding.at, the vectors kept
            table = model.positions.weight if hasattr(model.positions, "weight") else model.positions.pe
            x = x + rec("dec.pos", torch.nn.functional.embedding(positions, table).to(x.dtype))
        x = model.dropout(x)
    else:
        x = resume.take(f"dec.{resume.layer}.resid_pre", tokens.size(0))
    rotary = model.rotary(positions) if model.rotary is not None else None
    cache = model.start_cache(tokens.size(0), tokens.device)
    self_mask = cache.self_mask(tokens.size(1), key_mask, tokens.device)
    h = run_stack(rec, "dec", model.decoder, x, self_mask, rotary, explicit=explicit,
                  start=0 if resume is None else resume.layer)
    _logits(rec, model, h, logits_at)
    return rec.values


def trace(model, *inputs: Tensor, **options) -> dict[str, Tensor]:
    """:func:`trace_translation` (``src, tgt``) or :func:`trace_lm` (``tokens``), by the model's kind."""
    if model.cfg.decoder_only:
        return trace_lm(model, *inputs, **options)
    return trace_translation(model, *inputs, **options)


def _sinusoids(model, x: Tensor) -> Tensor:
    """PositionalEncoding.forward's table rows for x (B, T, C), as (B, T, C)."""
    from ..model.embedding import check_length

    check_length(x.size(1), model.positions.max_len)
    return model.positions.pe[: x.size(1)].to(x.dtype).expand_as(x)


def _explicit(attention: str) -> bool:
    if attention not in ("model", "explicit"):
        raise ValueError(f"attention={attention!r}: choose 'model' or 'explicit'")
    return attention == "explicit"
