"""Export to ONNX: the encoder and one decoder step, with the KV cache as explicit tensors.

Two graphs, exported with torch's ``torch.export``-based exporter
(``torch.onnx.export(..., dynamo=True)``, which builds the graphs with ``onnxscript``), opset 18:

    encoder.onnx
        in:  src        (B, S) int64, right-padded with pad_id, each sentence ending in EOS
        out: memory     (B, S, C) float32
             cross_k_i, cross_v_i   (B, H, S, D) per decoder layer i: the cross-attention
                                    K/V, projected once (``Transformer.start_cache``)
    decoder_step.onnx
        in:  tokens     (B, 1) int64, the token at position T_past (BOS first)
             src_mask   (B, S) bool, True = real source token (``src != pad_id``)
             cross_k_i, cross_v_i   from the encoder
             past_k_i, past_v_i     (B, H, T_past, D) self-attention K/V of the earlier
                                    positions; T_past = 0 at the first step
        out: logits     (B, V) float32, for the next token
             present_k_i, present_v_i   (B, H, T_past + 1, D): feed them back as past_*

All of B, S and T_past are dynamic: the ONNX dims ``batch``, ``src_len``, ``past_len`` (and
``past_len + 1``), for S <= max_len and T_past <= max_len - 1 (the model's ``max_len``
positions). At the first step T_past = 0: feed zero-size (B, H, 0, D) arrays as past_*.
The position of ``tokens`` is T_past, read from the shape of ``past_k_0``. :func:`check_onnx`
runs both graphs with onnxruntime against the model; :func:`greedy_onnx` is a reference
decoding loop on them.

``onnx``, ``onnxscript`` and ``onnxruntime`` are optional dependencies (the ``export`` extra).
"""
from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.export import Dim

from ..extras import require
from ..model import KVCache, Transformer

OPSET = 18  # the lowest the exporter builds natively (lower ones are converted from it)
ENCODER, DECODER = "encoder.onnx", "decoder_step.onnx"
CONFIG = "onnx_config.json"  # the model config and every graph's input and output names


def fp32_copy(model: Transformer) -> Transformer:
    """The model in float32 eval mode (a copy when it is in another dtype or training)."""
    if model.training or next(model.parameters()).dtype != torch.float32:
        model = copy.deepcopy(model).float().eval()
    return model


def kv_names(prefix: str, n_layers: int) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("k", "v")]


def flat(kv: tuple) -> list[Tensor]:
    """Per-layer (K, V) pairs as the graphs take and give them: K_0, V_0, K_1, V_1, ..."""
    return [t for pair in kv for t in pair]


def kv_pairs(flat: tuple[Tensor, ...]) -> tuple[tuple[Tensor, Tensor], ...]:
    """The reverse of :func:`flat`: per-layer (K, V) pairs."""
    return tuple(zip(flat[0::2], flat[1::2]))


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def compare_step(diffs: dict[str, float], got: list[np.ndarray], logits: Tensor, present: list[Tensor]) -> None:
    """Raise ``diffs["logits"]`` and ``diffs["present"]`` to one step's differences: a step
    graph's outputs ``got`` (the logits, then the grown cache) against the model's."""
    diffs["logits"] = max(diffs["logits"], _max_abs(got[0], logits.numpy()))
    diffs["present"] = max(diffs["present"], *(_max_abs(a, b.numpy()) for a, b in zip(got[1:], present)))


class Graph(nn.Module):
    """What one exported graph computes (its ``forward``) with the parts of ``model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class _EncoderGraph(Graph):
    def forward(self, src: Tensor) -> tuple[Tensor, ...]:
        # the source mask applied whether or not it hides anything (model.encode asks, on the
        # host, which a graph for every input cannot)
        model = self.model
        memory, _ = model.encoder(model.dropout(model.positions(model.src_embed(src))), model.src_mask(src))
        return (memory, *flat(model.decoder.cross_kv(memory)))


class _DecoderStepGraph(Graph):
    def forward(self, tokens: Tensor, src_mask: Tensor, *kv: Tensor) -> tuple[Tensor, ...]:
        n = self.model.cfg.n_layers
        cache = KVCache(cross_kv=kv_pairs(kv[:2 * n]), self_kv=kv_pairs(kv[2 * n:]), memory_mask=src_mask[:, None, None, :])
        logits, cache = self.model.decode(tokens, cache)
        return (logits[:, -1], *flat(cache.self_kv))


def _example_inputs(model: Transformer, batch: int = 2, src_len: int = 5, past: int = 3):
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    low = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = torch.randint(low, max(cfg.vocab_size, low + 1), (batch, src_len), generator=g)
    src[:, -1] = cfg.eos_id
    src[1:, -2:] = torch.tensor([cfg.eos_id, cfg.pad_id])  # the second row is padded
    tokens = torch.randint(low, max(cfg.target_vocab_size, low + 1), (batch, 1), generator=g)
    with torch.no_grad():
        enc = _EncoderGraph(model)(src)
        cache = model.start_cache(enc[0], src)
        prefix = torch.full((batch, past), cfg.bos_id, dtype=torch.long)
        prefix[:, 1:] = torch.randint(low, max(cfg.target_vocab_size, low + 1), (batch, past - 1), generator=g)
        _, cache = model.decode(prefix, cache)
    return src, tokens, src != cfg.pad_id, list(enc[1:]), flat(cache.self_kv)


@torch.no_grad()
def export_onnx(model: Transformer, out_dir: str | Path) -> Path:
    """Write ``encoder.onnx``, ``decoder_step.onnx`` and ``onnx_config.json`` (the model
    config and the graphs' input/output names) into ``out_dir``. Returns the directory."""
    model, out_dir = start_export(model, out_dir)
    src, tokens, src_mask, cross, past = _example_inputs(model)
    n, max_len = model.cfg.n_layers, model.cfg.max_len
    batch, src_len = Dim("batch"), Dim("src_len", max=max_len)
    past_len = Dim("past_len", min=0, max=max_len - 1)  # the position of ``tokens`` must be < max_len
    cross_names, past_names, present_names = kv_names("cross", n), kv_names("past", n), kv_names("present", n)

    enc_out = ["memory", *cross_names]
    export_graph(_EncoderGraph(model), (src,), ({0: batch, 1: src_len},), ["src"], enc_out, out_dir / ENCODER)
    dec_in = ["tokens", "src_mask", *cross_names, *past_names]
    dec_out = ["logits", *present_names]
    kv_shapes = tuple([{0: batch, 2: src_len}] * (2 * n) + [{0: batch, 2: past_len}] * (2 * n))
    export_graph(_DecoderStepGraph(model), (tokens, src_mask, *cross, *past),
            ({0: batch}, {0: batch, 1: src_len}, kv_shapes), dec_in, dec_out, out_dir / DECODER)

    write_config(out_dir, model, {"encoder": {"inputs": ["src"], "outputs": enc_out},
                                   "decoder_step": {"inputs": dec_in, "outputs": dec_out}})
    return out_dir


def start_export(model: nn.Module, out_dir: str | Path) -> tuple[nn.Module, Path]:
    """What every export starts with: the packages that write ONNX present, ``out_dir``
    made, the model in float32 eval mode (:func:`fp32_copy`)."""
    require("onnx", "export", __name__)  # torch.onnx.export's dynamo exporter writes with these two
    require("onnxscript", "export", __name__)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return fp32_copy(model), out_dir


def write_config(out_dir: Path, model: nn.Module, graphs: dict) -> None:
    """``onnx_config.json``: the model config, the opset and ``graphs`` (each graph's input
    and output names)."""
    info = {"model_config": model.cfg.to_dict(), "opset": OPSET, **graphs}
    (out_dir / CONFIG).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def read_config(out_dir: str | Path) -> dict:
    """The model config an export wrote into ``onnx_config.json``, as a mapping."""
    return json.loads((Path(out_dir) / CONFIG).read_text(encoding="utf-8"))["model_config"]


def export_graph(graph: nn.Module, args: tuple, dynamic_shapes: tuple, input_names: list[str],
            output_names: list[str], path: Path, deferred_asserts: bool = False) -> None:
    """torch.export, then the ONNX conversion, then the dynamic axes named after their Dims.

    The ExportedProgram goes to ``torch.onnx.export`` rather than the module with
    ``dynamic_shapes``: given Dims, the exporter renames the axes itself but warns once for
    every input after the first that shares a Dim (here every input shares one).
    ``verbose=False`` drops the exporter's progress lines, and the op registry's logged notes
    that torchvision (whose ops this model never uses) is not installed are kept to errors.
    One message from torch 2.13 itself remains, not about this model: a FutureWarning from
    ``copy.deepcopy`` of a pytree ``LeafSpec`` inside ``run_decompositions``.
    ``deferred_asserts``: a shape condition the exporter cannot prove for every length is
    checked when the graph runs instead of refusing the export (a language model's grouped
    K/V: torch cannot prove ``min(8 (L + 1), 16 (L + 1)) == 8 (L + 1)``, true for all L >= 0)."""
    program = torch.export.export(graph.eval(), args, dynamic_shapes=dynamic_shapes,
                                  prefer_deferred_runtime_asserts_over_guards=deferred_asserts)
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)
    try:
        onnx_program = torch.onnx.export(program, dynamo=True, input_names=input_names,
                                         output_names=output_names, opset_version=OPSET, verbose=False)
    finally:
        registry_log.setLevel(level)
    flat_shapes = [s for shapes in dynamic_shapes for s in (shapes if isinstance(shapes, tuple) else (shapes,))]
    names = {value.shape[axis]: dim.__name__ for value, shapes in zip(onnx_program.model.graph.inputs, flat_shapes)
             for axis, dim in shapes.items()}
    onnx_program.rename_axes(names)
    onnx_program.save(path)


def open_session(out_dir: str | Path, name: str):
    """An onnxruntime session on the CPU for the graph ``out_dir / name``, on torch's number
    of threads, its warnings kept to errors."""
    ort = require("onnxruntime", "export", __name__)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(Path(out_dir) / name), opts, providers=["CPUExecutionProvider"])


def _sessions(out_dir: str | Path):
    return open_session(out_dir, ENCODER), open_session(out_dir, DECODER)


@torch.no_grad()
def check_onnx(model: Transformer, out_dir: str | Path, src: Tensor | None = None,
               past_lengths: tuple[int, ...] = (0, 1, 4)) -> dict[str, float]:
    """Run the exported graphs with onnxruntime and compare with ``model``.

    Checks the encoder output and the one-step logits (and the grown cache) after
    ``past_lengths`` earlier target positions, on ``src`` (default: a padded random batch).
    Returns the largest absolute differences {"memory": .., "logits": .., "present": ..}.
    """
    model = fp32_copy(model)
    cfg = model.cfg
    if src is None:
        src = _example_inputs(model, batch=3, src_len=7)[0]
    enc, dec = _sessions(out_dir)
    outs = enc.run(None, {"src": src.numpy()})
    memory = model.encode(src)
    diffs = {"memory": _max_abs(outs[0], memory.numpy()), "logits": 0.0, "present": 0.0}
    src_mask = (src != cfg.pad_id).numpy()
    g = torch.Generator().manual_seed(1)
    for past in past_lengths:
        tgt = torch.randint(cfg.eos_id + 1, cfg.target_vocab_size, (src.size(0), past + 1), generator=g)
        tgt[:, 0] = cfg.bos_id
        cache = model.start_cache(memory, src)
        if past:
            _, cache = model.decode(tgt[:, :past], cache)
        feed = {"tokens": tgt[:, past:].numpy(), "src_mask": src_mask}
        feed.update(zip(kv_names("cross", cfg.n_layers), outs[1:]))
        feed.update(zip(kv_names("past", cfg.n_layers), _past_arrays(cache, src.size(0), model)))
        got = dec.run(None, feed)
        logits, cache = model.decode(tgt[:, past:], cache)
        compare_step(diffs, got, logits[:, -1], flat(cache.self_kv))
    return diffs


def _past_arrays(cache: KVCache, batch: int, model: Transformer) -> list[np.ndarray]:
    if cache.self_kv[0] is None:
        empty = np.zeros((batch, model.cfg.n_heads, 0, model.cfg.d_head), dtype=np.float32)
        return [empty] * (2 * model.cfg.n_layers)
    return [t.numpy() for t in flat(cache.self_kv)]


def greedy_onnx(out_dir: str | Path, src: Tensor, max_len: int, sessions=None) -> list[list[int]]:
    """Greedy decoding on the exported graphs (a reference loop, not tuned): for each
    sentence of ``src`` (B, S), its tokens up to and including EOS, at most ``max_len``
    (EOS forced there, as in :func:`~transformer.decode.greedy_search`). PAD and BOS are
    never chosen. Reads the config from ``onnx_config.json``."""
    cfg = read_config(out_dir)
    n, heads, d_head = cfg["n_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    enc, dec = sessions or _sessions(out_dir)
    batch = src.size(0)
    outs = enc.run(None, {"src": src.numpy()})
    feed = {"src_mask": (src != cfg["pad_id"]).numpy(), **dict(zip(kv_names("cross", n), outs[1:]))}
    feed.update({name: np.zeros((batch, heads, 0, d_head), np.float32) for name in kv_names("past", n)})
    tokens = np.full((batch, 1), cfg["bos_id"], dtype=np.int64)
    result: list[list[int]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    for step in range(1, max_len + 1):
        got = dec.run(None, {**feed, "tokens": tokens})
        logits = got[0]
        logits[:, cfg["pad_id"]] = -np.inf
        logits[:, cfg["bos_id"]] = -np.inf
        best = logits.argmax(axis=-1) if step < max_len else np.full(batch, cfg["eos_id"])
        for b in np.flatnonzero(~done):
            result[b].append(int(best[b]))
        done |= best == cfg["eos_id"]
        if done.all():
            break
        feed.update(zip(kv_names("past", n), got[1:]))
        tokens = best[:, None].astype(np.int64)
    return result
