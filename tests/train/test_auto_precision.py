"""Training's precision auto on a CPU (train/auto_precision.py): the precision whose updates
measured faster is chosen (a faked slow one never), the times are kept and read back, a failed
measurement falls back to the flags with one line, and measuring leaves the run's model and
random state as they were."""
from __future__ import annotations

import types

import pytest
import torch

from transformer import hardware
from transformer.decode import choose
from transformer.train import auto_precision
from transformer.train.train_config import TrainConfig

CPU = torch.device("cpu")
PAIRS = [([4, 5, 6, 7], [8, 9, 10]), ([4, 11], [12, 5, 6]), ([7, 7, 8, 9, 10], [11, 12])] * 6


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on (the suite runs with TRANSFORMER_MEASURE=off), a cache of this test's own,
    a CPU with native bf16 (where auto has a choice to make)."""
    monkeypatch.delenv(choose.ENV_VAR, raising=False)
    monkeypatch.setenv("TRANSFORMER_COMPILED_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setattr(choose, "_failed", set())
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    return tmp_path / "cache"


def task(max_tokens: int = 64):
    return types.SimpleNamespace(cfg=types.SimpleNamespace(max_tokens=max_tokens),
                                 data=types.SimpleNamespace(train=PAIRS))


def fake_times(monkeypatch, slow: str) -> list[str]:
    timed = []

    def time_updates(model, batch, cfg):
        timed.append(slow)
        return {p: 5.0 if p == slow else 1.0 for p in auto_precision.PRECISIONS}

    monkeypatch.setattr(auto_precision, "time_updates", time_updates)
    return timed


@pytest.mark.parametrize("slow, chosen", [("bf16", None), ("fp32", torch.bfloat16)])
def test_the_faster_precision_is_chosen_and_a_faked_slow_one_never(measuring, monkeypatch, make_model, slow, chosen):
    fake_times(monkeypatch, slow)
    lines = []
    got = auto_precision.choose_precision(TrainConfig(), make_model(), task(), CPU, 1, lines.append)
    assert got == chosen
    [line] = lines
    fast = "fp32" if slow == "bf16" else "bf16"
    assert line.startswith(f"precision auto: {fast} (measured") and "fp32" in line and "bf16" in line


def test_the_times_are_kept_and_read_back_by_the_next_run(measuring, monkeypatch, make_model):
    timed = fake_times(monkeypatch, "bf16")
    model = make_model()
    assert auto_precision.choose_precision(TrainConfig(), model, task(), CPU, 1, print) is None
    monkeypatch.setattr(choose, "_memory", {})  # a new process
    assert auto_precision.choose_precision(TrainConfig(), model, task(), CPU, 1, print) is None
    assert len(timed) == 1  # read from the cache, not timed again
    auto_precision.choose_precision(TrainConfig(max_tokens=32), model, task(32), CPU, 1, print)
    assert len(timed) == 2  # another batch shape: another recipe, timed


def test_a_failed_measurement_falls_back_to_the_flags_with_one_line(measuring, monkeypatch, make_model):
    def broken(model, batch, cfg):
        raise RuntimeError("no bf16 kernel\nsecond line")

    monkeypatch.setattr(auto_precision, "time_updates", broken)
    lines = []
    got = auto_precision.choose_precision(TrainConfig(), make_model(), task(), CPU, 1, lines.append)
    assert got == auto_precision.resolve_precision("auto", CPU)
    [line] = lines
    assert line.startswith("warning: cannot measure training's precision") and "no bf16 kernel" in line
    assert "flags" in line and "\n" not in line


@pytest.mark.parametrize("case", ["fp32 asked", "several processes", "measuring off", "emulated bf16"])
def test_the_flags_decide_without_timing(measuring, monkeypatch, make_model, case):
    timed = fake_times(monkeypatch, "bf16")
    cfg, world = TrainConfig(precision="fp32" if case == "fp32 asked" else "auto"), 2 if case == "several processes" else 1
    if case == "measuring off":
        monkeypatch.setenv(choose.ENV_VAR, "off")
    if case == "emulated bf16":
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    lines = []
    got = auto_precision.choose_precision(cfg, make_model(), task(), CPU, world, lines.append)
    assert got == auto_precision.resolve_precision(cfg.precision, CPU) and not timed and not lines


def test_measuring_leaves_the_model_and_the_random_state_as_they_were(make_model):
    model = make_model(dropout=0.1).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    batch = auto_precision.typical_batch(task(), model)
    seconds = auto_precision.time_updates(model, batch, TrainConfig())
    assert set(seconds) == {"fp32", "bf16"} and all(0 < s < float("inf") for s in seconds.values())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_typical_batch_fills_max_tokens_with_median_pairs(make_model):
    batch = auto_precision.typical_batch(task(max_tokens=20), make_model())
    assert 1 <= batch.src.size(0) <= 20 // 5
