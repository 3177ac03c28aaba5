"""Compiled generation on the fixed-shape cache (transformer/compiled/): the eager path is the
reference. The fixed-shape cache gives the growing cache's logits; the compiled step gives
the eager tokens, greedy and sampled, through the sliding window and stop tokens; a model
whose weights change is compiled afresh; a step that cannot be built generates eagerly; the
options reject bad values in one line."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig, compiled
from transformer.cli import main
from transformer.compiled.build import step_module
from transformer.compiled.search_step import CompiledStep
from transformer.decode import generate
from transformer.decode.decoding_config import DecodingConfig
from transformer.model import LanguageModel
from transformer.train.trainer import Trainer

SHAPES = {  # small, so that a compilation takes seconds on one core
    "llama": dict(preset="llama-char", d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, n_layers=2),
    "gpt": dict(preset="nanogpt-char", d_model=32, n_heads=2, d_ff=64, n_layers=2),
    "sinusoidal": dict(preset="nanogpt-char", d_model=32, n_heads=2, d_ff=64, n_layers=1, positions="sinusoidal",
                       norm_first=False),
}


def make_model(shape: str, max_len: int = 32, sharp: bool = True) -> LanguageModel:
    """Random weights; ``sharp``: the matrices scaled up so that no two logits are near a
    tie (rounding differences between two correct paths then cannot change a greedy token)."""
    torch.manual_seed(0)
    spec = dict(SHAPES[shape])
    model = LanguageModel(ModelConfig.preset(spec.pop("preset"), vocab_size=40, max_len=max_len, **spec)).eval()
    if sharp:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(8)
    return model


PROMPTS = [[5, 6, 7], [9] * 10, [3]]  # different lengths: left padding in one batch


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_fixed_shape_cache_gives_the_growing_caches_logits(shape):
    model = make_model(shape, sharp=False)
    from transformer.decode.eager_step import left_pad

    step = CompiledStep(model, lambda: step_module(model, 1, False), logprobs=False)  # its graph, run eagerly
    ids, real = left_pad(PROMPTS, model.cfg.pad_id, "cpu")
    with torch.inference_mode():
        cache = model.start_cache(len(PROMPTS))
        want, cache = model.decode(ids, cache, real=real)
        fixed, got = step.prefill(PROMPTS, 24)
        assert fixed.capacity == 32  # 24 positions rounded up to 64, never beyond max_len
        torch.testing.assert_close(got, want[:, -1])
        every = torch.ones(len(PROMPTS), 1, dtype=torch.bool)
        for i in range(32 - ids.size(1)):
            token = torch.tensor([[4 + i], [7], [30 - i]])
            want, cache = model.decode(token, cache, real=every)
            got, fixed = step(token, fixed)
            torch.testing.assert_close(got, want[:, -1])
        assert step.full(fixed) and fixed.length == 32
        with pytest.raises(ValueError, match="32 are used and 1 more do not fit"):
            step(token, fixed)


@pytest.mark.parametrize("shape", ["llama", "gpt"])
def test_compiled_generation_gives_the_eager_tokens(shape, without_gemm_timing):
    # (a step built with the GEMM timing: tests/decode/test_search_compiled.py)
    model = make_model(shape)
    # 60 new tokens with a context of 32: the windows slide (each row on its own)
    for temperature in (0.0, 1.0):
        eager = generate(model, PROMPTS, 60, temperature=temperature, seed=3)
        got = generate(model, PROMPTS, 60, temperature=temperature, seed=3, step=compiled.step(model, 1, False))
        assert got == eager and all(len(row) == 60 for row in eager)
    # a stop token ends each row where the eager path ends it
    stop = generate(model, PROMPTS, 60, temperature=1.0, seed=5)[0][10]
    eager = generate(model, PROMPTS, 60, temperature=1.0, seed=5, stop_id=stop)
    step = compiled.step(model, 1, False)
    assert generate(model, PROMPTS, 60, temperature=1.0, seed=5, stop_id=stop, step=step) == eager
    assert eager[0][-1] == stop and len(eager[0]) <= 11


def test_a_model_whose_weights_change_is_compiled_afresh(without_gemm_timing):
    model = make_model("gpt")
    first = generate(model, [[5, 6]], 12, temperature=0, step=compiled.step(model, 1, False))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    eager = generate(model, [[5, 6]], 12, temperature=0)
    assert eager != first  # the change matters, and the compiled step follows it
    assert generate(model, [[5, 6]], 12, temperature=0, step=compiled.step(model, 1, False)) == eager


def test_a_step_that_cannot_be_built_generates_the_eager_tokens(monkeypatch, recwarn):
    # no C++ compiler: the step a package would hold runs eagerly on the fixed-shape cache
    from transformer.compiled import build as aot

    def no_compiler(*args):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(aot, "build", no_compiler)
    model = make_model("llama")
    for temperature in (0.0, 1.0):
        eager = generate(model, PROMPTS, 40, temperature=temperature, seed=3)
        step = compiled.step(model, 1, False)
        assert generate(model, PROMPTS, 40, temperature=temperature, seed=3, step=step) == eager
    assert [str(w.message) for w in recwarn] == [  # (one model, one step: one try, one warning)
        "cannot build the compiled decoding step (RuntimeError: no C++ compiler found); decoding eagerly"]


def test_when_auto_compiles_and_how_large_the_cache_is(monkeypatch):
    # auto: a step that is built already, or a generation long enough to pay for building one
    from transformer.inference.generator import Generator

    model = make_model("gpt")

    def compiles(when: str, new_tokens: int) -> bool:
        decoding = DecodingConfig(compile=when, max_new_tokens=new_tokens, precision="fp32")
        return Generator(model, None, decoding, warn=False).compiles()[0]

    assert compiles("auto", 40_000) and not compiles("auto", 4096)
    monkeypatch.setattr(compiled, "is_built", lambda *a, **kw: True)  # built already
    assert compiles("auto", 1) and not compiles("off", 1)
    assert compiles("on", 1) and not compiles("off", 40_000)
    for other_type in (True, False, None, "yes"):  # one type: the string, from the command line to the search
        with pytest.raises(ValueError, match="compile must be one of auto, on, off"):
            DecodingConfig(compile=other_type)
    long = make_model("gpt", max_len=512)
    for prompt, new, capacity in ((16, 256, 320), (3, 5, 64), (16, 600, 512)):  # a multiple of 64, never
        cache, _ = CompiledStep(long, None, False).prefill([[5] * prompt], prompt + new)  # beyond the positions
        assert cache.capacity == capacity


def test_a_bad_compile_value_is_a_one_line_error(trained_lm, capsys):
    with pytest.raises(ValueError, match="compile must be one of auto, on, off, got 'sometimes'"):
        DecodingConfig(compile="sometimes")
    code = main(["generate", "--model", str(trained_lm), "--compile", "sometimes", "--prompt", "a"])
    err = capsys.readouterr().err
    assert code == 2 and "compile must be one of auto, on, off" in err and len(err.strip().splitlines()) == 1


def test_the_generate_command_builds_the_step_once_says_so_and_nothing_more(trained_lm, tmp_path, capsys,
                                                                            without_gemm_timing, monkeypatch):
    import shutil

    from transformer.compiled import build as aot, packages

    run = tmp_path / "run"
    shutil.copytree(trained_lm, run)
    argv = ["generate", "--model", str(run), "--prompt", "the cat", "--temperature", "0", "--max-new-tokens", "40"]
    assert main(argv + ["--compile", "off"]) == 0
    eager = capsys.readouterr()
    assert main(argv + ["--compile", "on"]) == 0
    compiled = capsys.readouterr()
    assert compiled.out == eager.out
    # one line on why it takes longer, no compiler chatter (inductor's GEMM timing tables, its warnings)
    assert compiled.err.splitlines() == ["compiling the decoding step (a minute or a few, once: it is kept in your "
                                         "cache)"] + eager.err.splitlines()
    assert [p.name.split("-")[0] for p in packages.run_folder(run).glob("*.pt2")] == ["generate"]
    # the default (auto) loads it, and builds nothing
    monkeypatch.setattr(aot, "build", lambda *a: pytest.fail("built again"))
    loads = []
    monkeypatch.setattr(aot, "load", lambda path, load=aot.load: loads.append(path) or load(path))
    assert main(argv) == 0
    assert capsys.readouterr() == eager and len(loads) == 1


def test_compile_true_trains_a_language_model_as_the_eager_step_does(lm_cfg, tmp_path):
    def losses(run, *extra):
        Trainer(lm_cfg("max_steps=6", *extra), tmp_path / run, log=lambda *a: None).train()
        import json

        recs = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in recs if "loss" in r]

    eager, got = losses("eager"), losses("compiled", "compile=true")
    assert len(eager) == len(got) == 6
    assert got == pytest.approx(eager, rel=1e-4, abs=1e-4)
