"""Copy the weights of a ``torch.nn.Transformer`` into our encoder and decoder stacks.

``torch.nn.Transformer`` has no embeddings, positions or output projection, so only the
two stacks are copied; the rest of our model keeps its own weights. It is useful as a
reference implementation: the same weights on the same embedded input must give the same
output (see ``tests/interop/test_torch_nn_parity.py``).

Name map (ours <- torch.nn):
    encoder.layers[i].self_attn.{q,k,v}_proj   <- encoder.layers[i].self_attn.in_proj_* (split in 3)
    encoder.layers[i].self_attn.out_proj       <- encoder.layers[i].self_attn.out_proj
    encoder.layers[i].ffn.fc1 / fc2            <- encoder.layers[i].linear1 / linear2
    encoder.layers[i].attn_block.norm          <- encoder.layers[i].norm1
    encoder.layers[i].ffn_block.norm           <- encoder.layers[i].norm2
    decoder.layers[i].self_attn / cross_attn   <- decoder.layers[i].self_attn / multihead_attn
    decoder.layers[i].{self,cross,ffn}_block.norm <- decoder.layers[i].norm1 / norm2 / norm3
    encoder.norm / decoder.norm                <- encoder.norm / decoder.norm
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import MultiHeadAttention, Transformer


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"load_from_torch_nn: {msg}")


def _copy(dst: Tensor, src: Tensor | None, name: str) -> None:
    """dst <- src, in place; a missing bias (``bias=False`` in torch.nn) becomes zeros."""
    if src is None:
        dst.zero_()
        return
    _check(dst.shape == src.shape,
           f"{name}: torch.nn.Transformer has shape {tuple(src.shape)}, our model {tuple(dst.shape)}")
    dst.copy_(src)


def _copy_linear(dst: nn.Linear, src: nn.Linear, name: str) -> None:
    _copy(dst.weight, src.weight, f"{name}.weight")
    _copy(dst.bias, src.bias, f"{name}.bias")


def _copy_norm(dst: nn.LayerNorm | None, src: nn.LayerNorm | None, name: str) -> None:
    _check(dst is not None and src is not None, f"{name}: a LayerNorm is missing on one side")
    _check(abs(dst.eps - src.eps) <= 1e-12 * max(dst.eps, 1.0),
           f"{name}: LayerNorm eps differs (torch.nn {src.eps}, ours {dst.eps}); set layer_norm_eps")
    _copy(dst.weight, src.weight, f"{name}.weight")
    _copy(dst.bias, src.bias, f"{name}.bias")


def _copy_attention(dst: MultiHeadAttention, src: nn.MultiheadAttention, name: str) -> None:
    _check(src.bias_k is None and not src.add_zero_attn,
           f"{name}: add_bias_kv / add_zero_attn have no counterpart in our attention")
    _check(src.num_heads == dst.n_heads,
           f"{name}: torch.nn has {src.num_heads} heads, our model {dst.n_heads}")
    if src.in_proj_weight is not None:  # (3C, C): rows [W_q; W_k; W_v]
        weights = src.in_proj_weight.chunk(3, dim=0)
    else:  # kdim / vdim differ from embed_dim: three separate matrices
        weights = (src.q_proj_weight, src.k_proj_weight, src.v_proj_weight)
    biases = (None,) * 3 if src.in_proj_bias is None else src.in_proj_bias.chunk(3, dim=0)
    for proj, w, b, part in zip((dst.q_proj, dst.k_proj, dst.v_proj), weights, biases, "qkv"):
        _copy(proj.weight, w, f"{name}.{part}_proj.weight")
        _copy(proj.bias, b, f"{name}.{part}_proj.bias")
    _copy_linear(dst.out_proj, src.out_proj, f"{name}.out_proj")


def _copy_module(dst: nn.Module, src: nn.Module, name: str) -> None:
    """An attention, a linear layer or a LayerNorm, whichever ``src`` is."""
    if isinstance(src, nn.MultiheadAttention):
        _copy_attention(dst, src, name)
    elif isinstance(src, nn.Linear):
        _copy_linear(dst, src, name)
    else:
        _copy_norm(dst, src, name)


# A layer's sub-modules, ours <- torch.nn's (the name map above), in the order they are checked.
LAYER_NAMES = {
    "encoder": {"self_attn": "self_attn", "ffn.fc1": "linear1", "ffn.fc2": "linear2", "attn_block.norm": "norm1",
                "ffn_block.norm": "norm2"},
    "decoder": {"self_attn": "self_attn", "cross_attn": "multihead_attn", "ffn.fc1": "linear1", "ffn.fc2": "linear2",
                "self_block.norm": "norm1", "cross_block.norm": "norm2", "ffn_block.norm": "norm3"},
}


def _activation_name(fn: object) -> str | None:
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    if fn is F.silu or isinstance(fn, nn.SiLU):
        return "silu"
    return None


def _check_layer(layer: nn.Module, model: Transformer, name: str) -> None:
    cfg = model.cfg
    act = _activation_name(layer.activation)
    _check(act == cfg.ffn_activation,
           f"{name}: activation {layer.activation!r} does not match ffn_activation={cfg.ffn_activation!r}")
    _check(layer.norm_first == cfg.norm_first,
           f"{name}: norm_first={layer.norm_first} but our model has norm_first={cfg.norm_first}")


@torch.no_grad()
def load_from_torch_nn(model: Transformer, ref: nn.Transformer) -> None:
    """Copy ``ref``'s encoder and decoder weights into ``model``, in place.

    Args:
        model: our Transformer, built with the same d_model, n_heads, d_ff, n_layers,
            activation, norm_first and layer_norm_eps as ``ref``, and ``final_norm=True``
            (``torch.nn.Transformer`` always ends each stack with a LayerNorm).
        ref: a ``torch.nn.Transformer`` (either ``batch_first``; the weights are the same).

    Raises:
        ValueError: when a size, the number of layers, the activation, norm placement or
            the final LayerNorms differ; the message names the first mismatch.
    """
    cfg = model.cfg
    _check(cfg.use_final_norm,
           "torch.nn.Transformer always has final encoder/decoder LayerNorms; build the model with final_norm=True")
    _check(cfg.ffn_activation != "swiglu", "torch.nn.Transformer has no gated (swiglu) feed-forward")
    n_enc, n_dec = len(ref.encoder.layers), len(ref.decoder.layers)
    _check(n_enc == cfg.n_layers and n_dec == cfg.n_layers,
           f"torch.nn.Transformer has {n_enc} encoder and {n_dec} decoder layers, our model n_layers={cfg.n_layers}")
    _check(ref.d_model == cfg.d_model, f"d_model: torch.nn {ref.d_model}, ours {cfg.d_model}")

    for stack, names in LAYER_NAMES.items():
        for i, (ours, theirs) in enumerate(zip(getattr(model, stack).layers, getattr(ref, stack).layers)):
            name = f"{stack}.layers[{i}]"
            _check_layer(theirs, model, name)
            for path, their_name in names.items():
                _copy_module(ours.get_submodule(path), getattr(theirs, their_name), f"{name}.{path}")

    _copy_norm(model.encoder.norm, ref.encoder.norm, "encoder.norm")
    _copy_norm(model.decoder.norm, ref.decoder.norm, "decoder.norm")
