"""A layer's wiring (which sub-layer comes first, each inside its residual connection and norm)
is written once, in the layer's ``sublayers``: the compiled step's graph, the trace and the
walkthrough built on it hand the layers their own attention (fixed-size buffers; recording and
replacement) instead of wiring residuals and norms a second time."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import transformer
from transformer import ModelConfig
from transformer.compiled.build import step_module
from transformer.compiled.search_step import FixedKVCache
from transformer.inspect.trace import trace_lm, trace_translation
from transformer.model import build_model, masks
from transformer.model.layers import DecoderLayer, EncoderLayer
from transformer.viz.engine import run_stack

PACKAGE = Path(transformer.__file__).parent
TRANSLATION = dict(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=16)
LM = dict(TRANSLATION, kind="decoder-only", positions="rope", norm="rms", n_kv_heads=1, norm_first=True)


class Calls(list):
    """The names of the layer classes whose ``sublayers`` ran, in order; ``shift``, added to
    every layer's output there, shows that what comes out is the wiring's."""

    shift = 0.0


@pytest.fixture
def wired(monkeypatch) -> Calls:
    calls = Calls()

    def spy(original):
        def sublayers(self, *args, **kwargs):
            calls.append(type(self).__name__)
            x, *rest = original(self, *args, **kwargs)
            return (x + calls.shift, *rest)
        return sublayers

    for cls in (EncoderLayer, DecoderLayer):
        monkeypatch.setattr(cls, "sublayers", spy(cls.sublayers))
    return calls


def model_of(**cfg):
    torch.manual_seed(0)
    return build_model(ModelConfig(**cfg)).eval()


def translation_step(model, group: int):
    """The compiled step's module, to be run eagerly (what is exported and built), and its
    inputs for one position (the encoder run already)."""
    src = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    cache = model.start_cache(model.encode(src), src)
    fixed = FixedKVCache.empty(model, 2 * group, 8)
    return step_module(model, group, True), (torch.full((2 * group, 1), 1), torch.tensor([0]), torch.arange(1),
                                             fixed.k, fixed.v, tuple(k for k, _ in cache.cross_kv),
                                             tuple(v for _, v in cache.cross_kv), cache.memory_mask)


def generation_step(model):
    tokens = torch.tensor([[0, 5, 6], [7, 8, 9]])
    fixed = FixedKVCache.empty(model, 2, 8)
    return step_module(model, 1, True), (tokens, tokens != 0, torch.arange(3), torch.arange(3), fixed.k, fixed.v,
                                         fixed.key_mask, fixed.next_position)


@pytest.mark.parametrize("group", [1, 3])
def test_the_compiled_step_runs_the_layers_own_wiring(wired, group):
    step, inputs = translation_step(model_of(**TRANSLATION), group)
    wired.clear()
    plain = step(*inputs)
    assert wired == ["DecoderLayer"] * 2  # each decoder layer once, through its sublayers
    wired.shift = 0.5
    assert not torch.equal(step(*inputs), plain)  # the step's output comes out of them


def test_the_generation_step_runs_the_layers_own_wiring(wired):
    step, inputs = generation_step(model_of(**LM))
    plain = step(*inputs)
    assert wired == ["DecoderLayer"] * 2
    wired.shift = 0.5
    assert not torch.equal(step(*inputs), plain)


def test_the_trace_runs_the_layers_own_wiring(wired):
    model = model_of(**TRANSLATION)
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 9, 10]])
    trace_translation(model, src, tgt, keep=["logits"])
    assert wired == ["EncoderLayer"] * 2 + ["DecoderLayer"] * 2
    wired.shift = 0.5  # what a layer's wiring returns is the next layer's input
    values = trace_translation(model, src, tgt, keep=["enc.0.resid_post", "enc.1.resid_pre"])
    torch.testing.assert_close(values["enc.1.resid_pre"], values["enc.0.resid_post"] + 0.5, rtol=0, atol=0)

    lm = model_of(**LM)
    wired.clear()
    trace_lm(lm, torch.tensor([[5, 6, 7]]), keep=["logits"])
    assert wired == ["DecoderLayer"] * 2


def test_the_walkthrough_runs_the_layers_own_wiring(wired):
    model = model_of(**TRANSLATION)
    x = torch.randn(1, 4, 16)
    run_stack(model.encoder.layers, x, None)
    run_stack(model.decoder.layers, x, masks.causal_mask(4), cross_kv=model.decoder.cross_kv(x),
              memory_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool))
    assert wired == ["EncoderLayer"] * 2 + ["DecoderLayer"] * 2


# what only a second copy of the wiring would touch: the sub-layer connections and how they
# are ordered; the graph reaches no part of a layer at all (it hands the decoder its cache)
WIRING = {"norm_first", "attn_block", "self_block", "cross_block", "ffn_block"}
LAYER_PARTS = WIRING | {"self_attn", "cross_attn", "ffn", "layers"}


def attributes(rel: str) -> set[str]:
    tree = ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


@pytest.mark.parametrize("rel,forbidden", [("compiled/graph.py", LAYER_PARTS), ("inspect/trace.py", WIRING),
                                           ("viz/engine.py", WIRING)])
def test_no_second_copy_of_the_wiring(rel, forbidden):
    assert not attributes(rel) & forbidden, f"{rel} wires a layer's sub-layers itself: {attributes(rel) & forbidden}"


def test_the_wiring_check_sees_a_copy():
    tree = ast.parse("x, _ = layer.self_block(x, attend)\nif block.norm_first: pass\n")
    assert {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & WIRING == {"self_block", "norm_first"}
