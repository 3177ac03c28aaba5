"""ONNX export of the decoder-only language model: one graph, one token step with the KV cache
as explicit tensors (the translation model's ``decoder_step.onnx`` without cross-attention).

    lm_step.onnx
        in:  tokens     (B, 1) int64, the token at position T_past
             past_k_i, past_v_i   (B, H_kv, T_past, D) self-attention K/V of the earlier
                                  positions per layer i; T_past = 0 at the first step
        out: logits     (B, V) float32, for the next token
             present_k_i, present_v_i   (B, H_kv, T_past + 1, D): feed them back as past_*

B and T_past are dynamic (``batch``, ``past_len``), T_past <= max_len - 1. H_kv is the
number of key/value heads (fewer than the query heads with grouped-query attention). Every
token is real: nothing is read as padding (GPT-2's padding id is a real token), so a batch
holds prompts of one length. A prompt is fed one token at a time (:func:`greedy_onnx_lm`).
Rotary positions (Llama 3's scaling included), learned or sinusoidal tables, biases and
norms are inside the graph as the model computes them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.export import Dim

from ..model import KVCache
from ..model.lm import LanguageModel
from .onnx import (Graph, compare_step, export_graph, flat, fp32_copy, kv_names, kv_pairs, open_session, read_config,
                   start_export, write_config)

LM_STEP = "lm_step.onnx"


class _LMStepGraph(Graph):
    def forward(self, tokens: Tensor, *kv: Tensor) -> tuple[Tensor, ...]:
        past = kv_pairs(kv)
        # the position of ``tokens`` is the cache's length (every cached token is real)
        start = torch.zeros(tokens.size(0), dtype=torch.long, device=tokens.device) + kv[0].size(2)
        cache = KVCache(cross_kv=(None,) * len(past), self_kv=past, memory_mask=None, padded=False,
                        next_position=start)
        h, cache, _ = self.model.hidden(tokens, cache, padded=False)
        logits = self.model.project(h)
        return (logits[:, -1], *flat(cache.self_kv))


def _past(model: LanguageModel, ids: Tensor) -> list[Tensor]:
    """The caches' K/V tensors after ``ids`` (B, T); zero-size ones for T = 0."""
    cfg = model.cfg
    if ids.size(1) == 0:
        return [torch.zeros(ids.size(0), cfg.kv_heads, 0, cfg.d_head)] * (2 * cfg.n_layers)
    _, cache, _ = model.hidden(ids, model.start_cache(ids.size(0)), padded=False)
    return flat(cache.self_kv)


@torch.no_grad()
def export_onnx_lm(model: LanguageModel, out_dir: str | Path) -> Path:
    """Write ``lm_step.onnx`` and ``onnx_config.json`` (the model config and the graph's
    input/output names) into ``out_dir``. Returns the directory."""
    model, out_dir = start_export(model, out_dir)
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 4), generator=g)
    n = cfg.n_layers
    past_names, present_names = kv_names("past", n), kv_names("present", n)
    batch, past_len = Dim("batch"), Dim("past_len", max=cfg.max_len - 1)
    inputs, outputs = ["tokens", *past_names], ["logits", *present_names]
    export_graph(_LMStepGraph(model), (ids[:, 3:], *_past(model, ids[:, :3])),
            ({0: batch}, tuple([{0: batch, 2: past_len}] * (2 * n))), inputs, outputs, out_dir / LM_STEP,
            deferred_asserts=True)
    write_config(out_dir, model, {"lm_step": {"inputs": inputs, "outputs": outputs}})
    return out_dir


@torch.no_grad()
def check_onnx_lm(model: LanguageModel, out_dir: str | Path, ids: Tensor | None = None,
                  past_lengths: tuple[int, ...] = (0, 1, 5)) -> dict[str, float]:
    """Run ``lm_step.onnx`` with onnxruntime after ``past_lengths`` earlier tokens of ``ids``
    (B, T) (default: random ids) and compare its logits and grown cache with ``model``'s.
    Returns the largest absolute differences {"logits": .., "present": ..}."""
    model = fp32_copy(model)
    cfg = model.cfg
    if ids is None:
        ids = torch.randint(0, cfg.vocab_size, (3, max(past_lengths) + 1), generator=torch.Generator().manual_seed(1))
    session = open_session(out_dir, LM_STEP)
    names = kv_names("past", cfg.n_layers)
    diffs = {"logits": 0.0, "present": 0.0}
    for past in past_lengths:
        got = session.run(None, {"tokens": ids[:, past:past + 1].numpy(),
                                 **{k: t.numpy() for k, t in zip(names, _past(model, ids[:, :past]))}})
        compare_step(diffs, got, model(ids[:, :past + 1], padded=False)[:, -1], _past(model, ids[:, :past + 1]))
    return diffs


def greedy_onnx_lm(out_dir: str | Path, prompt: list[int], max_new_tokens: int, session=None) -> list[int]:
    """Greedy continuation of ``prompt`` on ``lm_step.onnx`` (a reference loop, not tuned):
    the prompt is fed one token at a time, then ``max_new_tokens`` tokens are chosen (no stop
    token: as ``generate_stream`` without ``stop_id``). Reads the config from ``onnx_config.json``."""
    cfg = read_config(out_dir)
    n, d_head = cfg["n_layers"], cfg["d_model"] // cfg["n_heads"]
    kv_heads = cfg["n_kv_heads"] or cfg["n_heads"]
    session = session or open_session(out_dir, LM_STEP)
    names = kv_names("past", n)
    feed = {name: np.zeros((1, kv_heads, 0, d_head), np.float32) for name in names}
    out: list[int] = []
    token = prompt[0]
    for step in range(len(prompt) - 1 + max_new_tokens):
        got = session.run(None, {**feed, "tokens": np.array([[token]], dtype=np.int64)})
        feed.update(zip(names, got[1:]))
        if step + 1 < len(prompt):
            token = prompt[step + 1]
        else:
            token = int(got[0][0].argmax())
            out.append(token)
    return out
