"""``--device auto``, every command's default: a CUDA GPU when torch sees one, else the CPU;
a model handed over in memory stays where it is; int8 stays on the CPU; and every command
says which device it runs on. The GPU is faked (torch.cuda.is_available), so the choice is
tested here; nothing is moved to it."""
from __future__ import annotations

import json

import pytest
import torch

from transformer import ModelConfig, hardware
from transformer.decode.decoding_config import DecodingConfig
from transformer.decode.precision import decoding_device
from transformer.inference.front_door import AUTO_MIN_STEPS, GPU_MAX_TOKENS, MAX_TOKENS
from transformer.inference.generator import Generator
from transformer.model import LanguageModel
from transformer.inference.translator import Translator
from transformer.train import distributed


@pytest.fixture(params=[True, False], ids=["gpu", "no-gpu"])
def gpu(request, monkeypatch) -> bool:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: request.param)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return request.param


def test_auto_is_the_gpu_when_there_is_one(gpu):
    want = "cuda" if gpu else "cpu"
    assert hardware.resolve_device("auto") == want
    assert hardware.device_problem("auto") is None
    assert DecodingConfig().device == "auto"
    assert decoding_device(DecodingConfig()) == want  # a run opened from disk loads there
    assert distributed.from_env("auto").device == torch.device(want)  # train's default
    assert decoding_device(DecodingConfig(precision="int8")) == "cpu"  # int8 is a CPU format
    assert decoding_device(DecodingConfig(device="cpu")) == "cpu"  # what is named is kept
    assert hardware.resolve_device("cuda:1") == "cuda:1"


def test_a_model_in_memory_stays_where_its_owner_put_it(gpu, make_model):
    model = make_model()
    assert decoding_device(DecodingConfig(), model) == "cpu"
    with torch.device("meta"):
        on_meta = make_model()
    assert decoding_device(DecodingConfig(), on_meta) == "meta"


def test_a_translation_batch_is_larger_on_a_gpu():
    """max_tokens unset: 4,000 source tokens a batch, 20,000 for a translation on a GPU; a
    language model's scoring keeps 4,000 (its logits are the memory); a value given is kept."""
    assert DecodingConfig().max_tokens is None
    assert Translator.sized(DecodingConfig(device="cpu")).max_tokens == MAX_TOKENS == 4000
    assert Translator.sized(DecodingConfig(device="cuda")).max_tokens == GPU_MAX_TOKENS == 20000
    assert Generator.sized(DecodingConfig(device="cuda:1")).max_tokens == MAX_TOKENS
    assert Translator.sized(DecodingConfig(device="cuda", max_tokens=999)).max_tokens == 999


def test_compile_auto_decodes_eagerly_on_a_gpu():
    """compile auto builds a step for a long generation on a CPU; on a GPU, where the
    compiled step measured slower, auto stays eager (on still builds it)."""
    cfg = ModelConfig.preset("llama-char", vocab_size=23, d_model=32, n_heads=4, d_ff=64, n_layers=1, max_len=40)
    generator = Generator(LanguageModel(cfg), None, DecodingConfig(max_new_tokens=AUTO_MIN_STEPS, compile="auto"),
                          warn=False)
    assert generator.device == torch.device("cpu") and generator.decoding.max_tokens == MAX_TOKENS
    assert generator.compiles() == (True, True)
    generator.device = torch.device("cuda")  # what FrontDoor sets for a model on a GPU
    assert generator.compiles() == (False, False)
    assert generator.with_decoding(compile="on").compiles()[0]


def test_every_command_says_its_device(cli, trained, tmp_path, monkeypatch):
    """train in its log; evaluate in its report (and its JSON); translate, generate, attention
    and explain on stderr when it is a terminal, as the progress bar (a pipe or a log file
    gets nothing: what scripts read, and an error's one line, stay as they were)."""
    from transformer.cli import _progress

    on = hardware.device_line("cpu")
    assert on.startswith(f"cpu ({hardware.cpu_name()}, ") and "threads)" in on
    r = cli("translate", "--model", trained.run, "--compile", "off", stdin="red dog\n")
    assert r.code == 0 and r.out.strip() and "device" not in r.err, r.err
    monkeypatch.setattr(_progress, "stderr_is_terminal", lambda: True)
    r = cli("translate", "--model", trained.run, "--compile", "off", stdin="red dog\n")
    assert r.code == 0 and r.err.splitlines()[0].startswith(f"device: {on}; precision "), r.err
    monkeypatch.undo()
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"], "--ref",
            trained.corpus["valid_tgt"], "--compile", "off")
    assert r.code == 0 and f", on {on}, " in r.out.splitlines()[-1], r.out
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"], "--ref",
            trained.corpus["valid_tgt"], "--compile", "off", "--json")
    assert r.code == 0 and json.loads(r.out)["device"] == on
    r = cli("train", "--config", trained.config, "--out", tmp_path / "run", "--set", "max_steps=1",
            "--set", "precision=fp32")
    assert r.code == 0, r.err
    assert f"device: {on}; precision fp32" in r.out + r.err
