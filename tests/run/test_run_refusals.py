"""Runs that must be refused with a clear UserError, never a traceback: a run directory
resumed with another config, corrupt or truncated weights, state or subword files,
weights from another vocabulary."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from transformer.data import train_subwords
from transformer.errors import UserError
from transformer.run import latest_checkpoint, load_model
from transformer.train.trainer import Trainer
from transformer.inference.translator import load_translator


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, make_cfg) -> Path:
    """Two steps, one checkpoint, best.safetensors (evaluated at the end)."""
    run = tmp_path_factory.mktemp("refuse") / "run"
    Trainer(make_cfg("max_steps=2"), run, log=lambda *a: None).train()
    return run


@pytest.fixture
def run(small_run, tmp_path) -> Path:
    """A private copy of the small run, free to damage."""
    dst = tmp_path / "run"
    shutil.copytree(small_run, dst)
    return dst


@pytest.mark.parametrize("changes,named", [
    (["peak_lr=0.01"], ["peak_lr"]),
    (["label_smoothing=0.2", "seed=7"], ["label_smoothing", "seed"]),
    (["model.d_model=32"], ["model"]),
    (["vocab_size=100"], ["vocab_size"]),
])
def test_other_config_is_refused_naming_the_keys(run, make_cfg, changes, named):
    before = (run / "config.yaml").read_text()
    with pytest.raises(UserError) as e:
        Trainer(make_cfg("max_steps=4", *changes), run, log=lambda *a: None)
    msg = str(e.value)
    assert str(run) in msg and "\n" not in msg
    for key in named:
        assert key in msg
    assert "max_steps" not in msg  # a resumable change is not reported
    assert (run / "config.yaml").read_text() == before  # the run's own config is kept


def test_resumable_changes_are_accepted(run, make_cfg):
    trainer = Trainer(make_cfg("max_steps=3", "keep_last=3", "eval_every=50", "valid_limit=5", "patience=2"),
                      run, log=lambda *a: None)
    assert trainer.step == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["max_steps"] == 3


def test_failed_first_attempt_does_not_poison_the_run_dir(tmp_path, make_cfg, corpus):
    run = tmp_path / "run"
    with pytest.raises(UserError, match="nonexistent.src"):
        Trainer(make_cfg("max_steps=1", f"train_src={tmp_path / 'nonexistent.src'}"), run, log=lambda *a: None)
    result = Trainer(make_cfg("max_steps=1"), run, log=lambda *a: None).train()  # the corrected config
    assert result["step"] == 1


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"this is not a safetensors file\n" * 50)
    elif how == "last_byte_missing":
        path.write_bytes(data[:-1])


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "last_byte_missing"])
def test_corrupt_weights_give_user_error(run, how):
    weights = latest_checkpoint(run) / "model.safetensors"
    _corrupt(weights, how)
    with pytest.raises(UserError) as e:
        load_model(weights)
    assert str(weights) in str(e.value)
    # A run directory prefers best.safetensors; damage it too and the error names it.
    _corrupt(run / "best.safetensors", how)
    with pytest.raises(UserError, match="best.safetensors"):
        load_model(run)
    with pytest.raises(UserError, match="best.safetensors"):
        load_translator(run)


def test_weights_without_model_config_metadata(run, tmp_path):
    from safetensors.torch import load_file, save_file

    bare = tmp_path / "bare.safetensors"
    save_file(load_file(str(run / "best.safetensors")), str(bare))
    with pytest.raises(UserError, match="no model config"):
        load_model(bare)


def test_resume_from_corrupt_checkpoint_is_a_user_error(run, make_cfg):
    latest = latest_checkpoint(run)
    _corrupt(latest / "model.safetensors", "truncated")
    with pytest.raises(UserError) as e:
        Trainer(make_cfg("max_steps=4"), run, log=lambda *a: None)
    assert str(latest / "model.safetensors") in str(e.value)


def test_resume_from_corrupt_state_names_the_way_out(run, make_cfg):
    latest = latest_checkpoint(run)
    (latest / "state.pt").write_bytes(b"PK\x03\x04 broken zip")
    with pytest.raises(UserError) as e:
        Trainer(make_cfg("max_steps=4"), run, log=lambda *a: None)
    assert str(latest / "state.pt") in str(e.value) and "delete" in str(e.value)


def test_translator_refuses_subwords_of_another_vocabulary(run, tmp_path, corpus):
    other = train_subwords(corpus["train_src"].read_text().splitlines(), tmp_path / "other", vocab_size=90)
    shutil.copy(other.path, run / "subwords.model")
    with pytest.raises(UserError) as e:
        load_translator(run)
    msg = str(e.value)
    assert "90" in msg and "120" in msg and "subwords.model" in msg


def test_resume_refuses_subwords_of_another_vocabulary(run, tmp_path, corpus, make_cfg):
    other = train_subwords(corpus["train_src"].read_text().splitlines(), tmp_path / "other", vocab_size=90)
    shutil.copy(other.path, run / "subwords.model")
    with pytest.raises(UserError, match="another model config or vocabulary"):
        Trainer(make_cfg("max_steps=4"), run, log=lambda *a: None)


def test_resume_refuses_another_subword_model_of_the_same_size(run, tmp_path, corpus, make_cfg):
    # Same size, different pieces: trained on the target side only.
    other = train_subwords(corpus["train_tgt"].read_text().splitlines(), tmp_path / "other", vocab_size=120)
    assert other.vocab_size == 120
    shutil.copy(other.path, run / "subwords.model")
    with pytest.raises(UserError, match="another subwords.model"):
        Trainer(make_cfg("max_steps=4"), run, log=lambda *a: None)
