"""Shared tiny-config fixtures for the model, decoding and training tests.

Every model here is small enough that a forward pass costs well under a millisecond on a
CPU; dropout is 0 so that eval and train outputs are deterministic unless a test asks.
"""
from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from transformer import ModelConfig, Transformer

# Tiny models spend their time in thread hand-offs, not arithmetic: on a shared 2-core machine
# a forward pass takes ~5 ms with one intra-op thread and ~130 ms with two under load.
torch.set_num_threads(1)

# ids: pad 0, bos 1, eos 2; real tokens 3 .. vocab_size - 1
TINY: dict[str, Any] = dict(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=64)

# The model variants whose behaviour must not depend on the option (cache, padding, leaks).
VARIANTS: dict[str, dict[str, Any]] = {
    "post-norm": {},
    "pre-norm": dict(norm_first=True),
    "swiglu": dict(ffn_activation="swiglu"),
    "untied": dict(tie_embeddings=False, tgt_vocab_size=11, output_bias=True),
    "concat-gelu": dict(sinusoid_layout="concat", ffn_activation="gelu"),
}


def tiny_config(**overrides: Any) -> ModelConfig:
    return ModelConfig(**{**TINY, **overrides})


def build_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> Transformer:
    """A tiny model in eval mode, seeded; biases and LayerNorm affine parameters are made
    non-trivial so that a test cannot pass because they happen to be 0 or 1."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**overrides)).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(autouse=True, scope="session")
def compiled_steps_cache(tmp_path_factory):
    """The user's cache of compiled decoding steps (compiled/packages.py) is a temporary folder
    of this session's (of each xdist worker's): no test writes to ~/.cache or sees another's
    packages; and a TRANSFORMER_COMPILE in the developer's environment does not reach the tests.
    Decoding's choices (decode/choose.py) come from the flags (TRANSFORMER_MEASURE=off).
    torch's compiler builds in that cache's private inductor folder for every compile of the
    session, the tests' own torch.compile calls too (compiled/packages.py: under ATEN_CPU_CAPABILITY
    a folder of its own, whose kernels must not mix with the others')."""
    from transformer.run.private import BUILD_ENV_VAR, use_private_build_folder

    saved = {k: os.environ.get(k) for k in ("TRANSFORMER_COMPILED_DIR", "TRANSFORMER_COMPILE", BUILD_ENV_VAR,
                                            "TRANSFORMER_MEASURE")}
    folder = tmp_path_factory.mktemp("compiled-steps")
    os.environ["TRANSFORMER_COMPILED_DIR"] = str(folder)
    os.environ.pop("TRANSFORMER_COMPILE", None)
    # decoding's kernels chosen by the CPU's flags, not timed: the same choice in every test
    # and worker (tests/decode/test_choose.py measures, with the times faked)
    os.environ["TRANSFORMER_MEASURE"] = "off"
    os.environ.pop(BUILD_ENV_VAR, None)
    use_private_build_folder()
    yield folder
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def without_gemm_timing(monkeypatch) -> None:
    """The compiled decoding step built without inductor's GEMM timing (``max_autotune_gemm``,
    whose candidate kernels cost C++ builds at every compilation): for the tests of what the
    search does around the step (caching, recompiling, bucketing, options). The tests that
    compare the compiled step's tokens with eager's keep the options users get."""
    from transformer.compiled import build as aot

    monkeypatch.setattr(aot, "INDUCTOR_OPTIONS", {**aot.INDUCTOR_OPTIONS, "max_autotune_gemm": False})


@pytest.fixture
def fake_builds(monkeypatch) -> list[Path]:
    """compiled.build's build and load without inductor (used by the decode and faults tests of where
    compiled steps live): a package is a small file that aot.load accepts only unchanged;
    every build's path is recorded in the returned list."""
    from transformer.compiled import build as aot

    built: list[Path] = []

    def build(model, group, logprobs, path):
        built.append(Path(path))
        Path(path).write_bytes(b"package")

    def load(path):
        if Path(path).read_bytes() != b"package":
            raise RuntimeError("not a package")
        return object()

    monkeypatch.setattr(aot, "build", build)
    monkeypatch.setattr(aot, "load", load)
    return built


@pytest.fixture
def tiny_cfg() -> ModelConfig:
    return tiny_config()


@pytest.fixture
def make_model() -> Callable[..., Transformer]:
    """``make_model(seed=0, dtype=torch.float32, **config_overrides)`` -> tiny eval-mode model."""
    return build_model


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def variant_model(request) -> Transformer:
    """The tiny model in each configuration of :data:`VARIANTS`."""
    return build_model(seed=1, **VARIANTS[request.param])


@pytest.fixture
def rand_tokens() -> Callable[..., torch.Tensor]:
    """``rand_tokens(lengths, vocab=13, width=None)`` -> (len(lengths), width) real-token ids
    (>= 3, so never pad / bos / eos), right-padded with 0 after each sentence's length.
    Seeded once per test, so a test's inputs are reproducible."""
    gen = torch.Generator().manual_seed(1234)

    def make(lengths: list[int], vocab: int = TINY["vocab_size"], width: int | None = None) -> torch.Tensor:
        width = max(lengths) if width is None else width
        x = torch.randint(3, vocab, (len(lengths), width), generator=gen)
        for i, n in enumerate(lengths):
            x[i, n:] = 0
        return x

    return make


# ---- the toy corpus (used by the run, faults and dist tests) -----------------------------
@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """tiny_corpus.py's word-for-word corpus (400 training pairs, 20 validation pairs), one
    folder for all xdist workers: a run trained once for all of them (``build_once``) names
    the same files in every worker's config."""
    from tiny_corpus import build_once, corpus_files, write_corpus

    return corpus_files(build_once(tmp_path_factory, "corpus", write_corpus))


# ---- a log= callback for Trainer (used by the run and faults tests) ---------------------
class Log(list):
    """A ``log=`` callback for Trainer that keeps the lines."""

    def __call__(self, *parts) -> None:
        self.append(" ".join(str(p) for p in parts))

    def text(self) -> str:
        return "\n".join(self)


@pytest.fixture
def log() -> Log:
    return Log()


# ---- the command line, in-process (used by the cli, export and viz tests) ----------------
@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*argv, stdin=None)`` -> Result(code, out, err) from ``transformer.cli.main``."""
    from transformer.cli import main

    def run(*argv, stdin: str | None = None) -> Result:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse (--help, usage errors)
            code = e.code if isinstance(e.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def assert_one_line_error(r: Result, command: str, *mentions) -> None:
    """Exit code 2 and exactly one stderr line ``transformer COMMAND: error: ...`` naming ``mentions``."""
    assert r.code == 2, (r.code, r.err)
    assert "Traceback" not in r.err + r.out
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith(f"transformer {command}: error: "), lines[0]
    for m in mentions:
        assert str(m) in lines[0], (m, lines[0])


@pytest.fixture
def one_line_error():
    """``one_line_error(result, command, *mentions)``: see :func:`assert_one_line_error`."""
    return assert_one_line_error
