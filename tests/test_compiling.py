"""transformer/compiling.py: what the model needs inside a traced graph, applied by the code that
compiles (torch.compile once the module is imported; torch.export inside traced()). The
encoder-decoder's training forward compiles to one graph (no break on data-dependent
branches or on the eager dropout's in-place random numbers) with the eager numbers without
dropout, and real dropout with it; the embedding's gradient stays torch's own kernel; outside
the block the model's own functions are back, and model/ holds no compiler branch."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from transformer import compiling
from transformer.compiling import attention  # the module (transformer.model.attention is the function)
from transformer.model import dropout, embedding, masks
from transformer.model.embedding import LearnedPositions, TokenEmbedding


def test_traced_replaces_the_models_host_reads_and_kernels_and_puts_them_back():
    originals = (masks.hides_any, embedding.position_end, attention._fused_pays, dropout.dropout_mask,
                 embedding.lookup)
    with compiling.traced():
        assert masks.hides_any(torch.ones(3, dtype=torch.bool))  # every mask applied
        assert embedding.position_end(torch.tensor([10_000])) == 0  # the check is eager code's
        assert not attention._fused_pays(torch.ones(1, dtype=torch.float32))  # CPU: the explicit form
        with compiling.traced():  # nested: still replaced, and restored to the replacements
            pass
        assert masks.hides_any(torch.ones(3, dtype=torch.bool))
    assert (masks.hides_any, embedding.position_end, attention._fused_pays, dropout.dropout_mask,
            embedding.lookup) == originals
    assert not masks.hides_any(torch.ones(3, dtype=torch.bool))


def test_the_model_has_no_compiler_branches():
    model_dir = Path(embedding.__file__).parent
    found = {p.name for p in model_dir.glob("*.py")
             if re.search(r"is_compiling|Slots|decode_static|_static\(", p.read_text(encoding="utf-8"))}
    assert not found, f"model modules that know the compiler: {sorted(found)}"


def test_the_training_forward_compiles_to_one_graph_with_the_eager_numbers(make_model, rand_tokens):
    model = make_model(seed=0, dropout=0.0).train()
    src = rand_tokens([6, 3, 5], width=6)  # padded sources: the mask is applied
    tgt = rand_tokens([4, 5, 2], width=5)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)  # fullgraph: a break is an error
    torch.testing.assert_close(compiled(src, tgt), model(src, tgt), rtol=1e-4, atol=1e-4)
    logits = compiled(src, tgt)
    logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_compiled_dropout_drops_about_p_and_keeps_the_expectation():
    from transformer.model.dropout import Dropout

    drop = Dropout(0.25).train()
    x = torch.ones(200, 500)
    y = torch.compile(drop, fullgraph=True)(x)
    dropped = (y == 0).float().mean().item()
    assert 0.24 < dropped < 0.26
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))
    assert not torch.equal(y, torch.compile(drop, fullgraph=True)(x))  # a fresh mask each call


def _lookup_and_grad(fn, ids, weight, upstream):
    w = weight.detach().clone().requires_grad_(True)
    out = fn(ids, w)
    (out * upstream).sum().backward()
    return out.detach(), w.grad


@pytest.mark.parametrize("rows", [5, 300])
def test_compiled_lookup_has_torchs_gradient_for_repeated_ids(rows):
    """Compiled, the lookup's gradient comes from torch's own embedding backward
    (a custom op, not inductor's scatter): the same rows summed per id, rows never looked up
    zero."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(rows, 4), (3, 37), generator=g)  # few ids, each many times
    weight = torch.randn(rows, 16, generator=g)
    upstream = torch.randn(3, 37, 16, generator=g)
    eager = _lookup_and_grad(torch.nn.functional.embedding, ids, weight, upstream)
    with torch.profiler.profile() as prof:
        compiled = _lookup_and_grad(torch.compile(embedding.lookup, fullgraph=True), ids, weight, upstream)
    assert "transformer::embedding_grad" in {e.key for e in prof.key_averages()}
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-6, atol=1e-5)
    assert compiled[1][4:].abs().sum() == 0  # ids are 0..3


def test_compiled_token_embedding_and_learned_positions_train_as_eager():
    torch.manual_seed(0)
    embed, pos = TokenEmbedding(11, 8, pad_id=0), LearnedPositions(8, 20)
    tokens = torch.randint(0, 11, (4, 20))
    positions = torch.arange(20).expand(4, 20)

    def forward(tokens, positions):
        return pos.at(embed(tokens), positions).square().sum()

    grads = []
    for fn in (forward, torch.compile(forward, fullgraph=True)):
        embed.zero_grad(set_to_none=True)
        pos.zero_grad(set_to_none=True)
        fn(tokens, positions).backward()
        grads.append((embed.weight.grad.clone(), pos.weight.grad.clone()))
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_embedding_grad_is_a_well_formed_custom_op():
    g = torch.Generator().manual_seed(0)
    torch.library.opcheck(compiling.embedding_grad, (torch.randn(6, 4, generator=g), torch.tensor([0, 2, 2, 1, 0, 2]), 3))


def test_training_with_compile_true_loads_the_forms_first():
    """The forms take effect once this module is imported; decoding imports it only where it
    builds a step, so training's torch.compile (compile: true) must import it itself. In a
    fresh interpreter (this one has imported it already)."""
    import subprocess
    import sys

    probe = ("import sys, types, torch\n"
             "from transformer.train.trainer import Trainer\n"
             "before = 'transformer.compiling' in sys.modules\n"
             "t = Trainer.__new__(Trainer)\n"
             "t.cfg, t.device, t.log = types.SimpleNamespace(compile=True), torch.device('cpu'), lambda *a: None\n"
             "t._compiled(None)\n"
             "print(before, 'transformer.compiling' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
