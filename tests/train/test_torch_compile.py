"""Training's torch.compile (``compile: true``, train/torch_compile.py): the code that compiles
gives the model being trained the forms its parts take in a graph and compiles the forward pass and
the loss with ``fullgraph=True``, so a graph break is an error (that the compiled updates train
as the eager ones do: tests/lm/test_generate_compiled.py); outside a graph those forms are the
model's eager modules; the embedding's
gradient stays torch's own kernel; and model/ holds nothing that exists for a compiler, an
exporter or int8 layers."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))

from lm_text import make_text  # noqa: E402

import transformer.model  # noqa: E402
from transformer.model.dropout import Dropout  # noqa: E402
from transformer.train import torch_compile as compiled  # noqa: E402
from transformer.train.torch_compile import GRAPH_FORMS, compiled_training, lookup  # noqa: E402
from transformer.train.train_config import load_config  # noqa: E402
from transformer.train.trainer import Trainer  # noqa: E402

TOY = ["dataset=text", "tokenizer=chars", "model.preset=nanogpt-char", "model.d_model=32", "model.n_heads=2",
       "model.d_ff=64", "model.n_layers=1", "model.max_len=16", "batch_size=4", "optimizer=adamw",
       "lr_schedule=cosine", "peak_lr=0.01", "min_lr=0.001", "warmup=2", "precision=fp32", "progress=false",
       "threads=1", "log_every=1", "eval_every=1000", "save_every=1000", "max_steps=3"]


def toy_config(tmp_path, *overrides: str):
    text = tmp_path / "tiny.txt"
    if not text.exists():
        text.write_text(make_text(), encoding="utf-8")
    return load_config(None, [*TOY, f"text_files=[{text}]", *overrides])


def test_a_graph_break_is_an_error(monkeypatch, tmp_path):
    """Without its graph form, dropout's in-place random numbers break the graph: with
    fullgraph=True that is an error at the first update, not a slower run."""
    monkeypatch.setitem(GRAPH_FORMS, Dropout, Dropout)
    trainer = Trainer(toy_config(tmp_path, "compile=true", "model.dropout=0.1"), tmp_path / "run",
                      log=lambda *a: None)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="random_"):
        trainer.train()


def test_outside_a_graph_the_forms_are_the_eager_modules(tmp_path):
    """Validation, checkpoints and decoding run the model eagerly after training compiled it:
    the same numbers, dropout's random numbers included, as before it had its graph forms."""
    model = transformer.model.build_model(toy_config(tmp_path, "model.dropout=0.2").model_config(30))
    tokens = torch.randint(0, 30, (2, 16), generator=torch.Generator().manual_seed(0))
    before = []
    for training in (False, True):
        torch.manual_seed(1)
        before.append(model.train(training)(tokens))
    compiled_training(model, None, cpu=True)
    assert any(isinstance(m, compiled.GraphAttention) for m in model.modules())
    for training, expected in zip((False, True), before):
        torch.manual_seed(1)
        assert torch.equal(model.train(training)(tokens), expected)


def test_graph_dropout_drops_about_p_and_keeps_the_expectation():
    drop = compiled.GraphDropout(0.25).train()
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
        got = _lookup_and_grad(torch.compile(lookup, fullgraph=True), ids, weight, upstream)
    assert "transformer::embedding_grad" in {e.key for e in prof.key_averages()}
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], eager[1], rtol=1e-6, atol=1e-5)
    assert got[1][4:].abs().sum() == 0  # ids are 0..3


def test_embedding_grad_is_a_well_formed_custom_op():
    g = torch.Generator().manual_seed(0)
    torch.library.opcheck(compiled.embedding_grad, (torch.randn(6, 4, generator=g), torch.tensor([0, 2, 2, 1, 0, 2]), 3))


def test_the_model_holds_nothing_for_a_compiler_an_exporter_or_int8():
    """The issue's own check (grep -rniE "compil|is_exporting|int8|aot|inductor" model/): no
    function, branch or docstring of the model exists for another room."""
    model_dir = Path(transformer.model.__file__).parent
    found = {f"{p.name}:{n}": line.strip() for p in sorted(model_dir.glob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"compil|is_exporting|int8|aot|inductor", line, re.IGNORECASE)}
    assert not found, found
