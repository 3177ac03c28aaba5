"""``--device auto``, every command's default: a CUDA GPU when torch sees one, else the CPU;
a model handed over in memory stays where it is; int8 stays on the CPU; and every command
says which device it runs on. The GPU is faked (torch.cuda.is_available), so the choice is
tested here; nothing is moved to it."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig, hardware
from transformer.decode.decoding_config import DecodingConfig
from transformer.front_door import AUTO_MIN_STEPS, decoding_device
from transformer.generator import Generator
from transformer.model import LanguageModel
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


def test_compile_auto_decodes_eagerly_on_a_gpu():
    """compile auto builds a step for a long generation on a CPU; on a GPU, where the
    compiled step measured slower, auto stays eager (on still builds it)."""
    cfg = ModelConfig.preset("llama-char", vocab_size=23, d_model=32, n_heads=4, d_ff=64, n_layers=1, max_len=40)
    generator = Generator(LanguageModel(cfg), None, DecodingConfig(max_new_tokens=AUTO_MIN_STEPS, compile="auto"),
                          warn=False)
    assert generator.device == torch.device("cpu")
    assert generator.compiles() == (True, True)
    generator.device = torch.device("cuda")  # what FrontDoor sets for a model on a GPU
    assert generator.compiles() == (False, False)
    assert generator.with_decoding(compile="on").compiles()[0]


def test_every_command_says_its_device(cli, trained, tmp_path):
    line = f"device: {hardware.device_line('cpu')}; precision "
    assert line.startswith(f"device: cpu ({hardware.cpu_name()}, ")
    r = cli("translate", "--model", trained.run, "--compile", "off", stdin="red dog\n")
    assert r.code == 0 and r.out.strip()
    assert r.err.splitlines()[0].startswith(line), r.err
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"], "--ref",
            trained.corpus["valid_tgt"], "--limit", "3", "--compile", "off")
    assert r.code == 0 and line in r.err, r.err
    r = cli("train", "--config", trained.config, "--out", tmp_path / "run", "--set", "max_steps=1",
            "--set", "precision=fp32")
    assert r.code == 0, r.err
    assert f"device: {hardware.device_line('cpu')}; precision fp32" in r.out + r.err
