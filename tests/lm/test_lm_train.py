"""The language model through the same trainer as translation: the loss falls, the run
directory holds its tokenizer, metrics and learning curve, validation reports nats and bits
per character, and a resumed run is bit-identical to an uninterrupted one."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transformer.train.trainer import Trainer


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]


def test_the_loss_falls_and_the_run_has_its_files(tmp_path, lm_cfg, log):
    run = tmp_path / "run"
    result = Trainer(lm_cfg("max_steps=40", "eval_every=20"), run, log=log).train()
    assert result["step"] == 40 and result["reason"] == "max_steps"
    recs = records(run)
    losses = [r["loss"] for r in recs if "event" not in r]
    assert losses[0] > math.log(30) - 0.5  # about uniform over the vocabulary at first
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    evals = [r for r in recs if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [20, 40] and evals[1]["valid_nll"] < evals[0]["valid_nll"]
    for r in evals:  # characters: a token is a character
        assert r["valid_bpc"] == __import__("pytest").approx(r["valid_nll"] / math.log(2))
        assert r["valid_score"] == -r["valid_nll"]
    assert (run / "chars.json").is_file() and not (run / "subwords.model").exists()
    assert (run / "best.safetensors").is_file() and (run / "learning_curve.png").is_file()
    assert "best validation loss" in log.text() and "12 windows" not in log.text()


def test_bpe_tokenizer_reports_nats_per_character(tmp_path, lm_cfg, log):
    run = tmp_path / "run"
    Trainer(lm_cfg("tokenizer=bpe", "vocab_size=60", "max_steps=2"), run, log=log).train()
    ev = [r for r in records(run) if r.get("event") == "eval"][-1]
    assert (run / "subwords.model").is_file() and not (run / "chars.json").exists()
    assert ev["valid_nll_per_char"] < ev["valid_nll"]  # a subword stands for more than one character
    assert ev["valid_bpc"] == __import__("pytest").approx(ev["valid_nll_per_char"] / math.log(2))


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / f"checkpoints/step-{step:07d}/model.safetensors"))


def test_resume_is_bit_exact(tmp_path, lm_cfg, log):
    # dropout on: the RNG state matters; the cosine's horizon is fixed, not the resumable max_steps
    common = ("model.dropout=0.1", "save_every=2", "keep_last=10", "lr_decay_steps=8")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(lm_cfg(*common, "max_steps=8"), straight, log=log).train()
    Trainer(lm_cfg(*common, "max_steps=4"), resumed, log=log).train()
    Trainer(lm_cfg(*common, "max_steps=8"), resumed, log=log).train()
    assert "resumed from" in log.text()
    a, b = weights(straight, 8), weights(resumed, 8)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loss = lambda run: [r["loss"] for r in records(run) if "event" not in r]  # noqa: E731
    assert loss(straight) == loss(resumed)


def test_checkpoints_average(tmp_path, lm_cfg, log):
    run = tmp_path / "run"
    Trainer(lm_cfg("max_steps=4", "save_every=1", "average_last=3"), run, log=log).train()
    assert (run / "averaged.safetensors").is_file()


def test_a_run_resumes_under_options_newer_than_it(tmp_path, lm_cfg, log):
    """A config.yaml written before an option existed reads as holding its default."""
    import yaml

    run = tmp_path / "run"
    Trainer(lm_cfg("max_steps=2"), run, log=log).train()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    del saved["lr_decay_steps"]  # as a run from before lr_decay_steps would have it
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert Trainer(lm_cfg("max_steps=3"), run, log=log).train()["step"] == 3


@pytest.mark.parametrize("preset", ["nanogpt-char", "llama-char"])
def test_an_absurd_rate_stops_at_the_update_that_broke_the_weights(lm_cfg, tmp_path, preset):
    """Weights near 1e29 may give a language model a finite loss (every token equally likely)
    but never a finite gradient: the skipped update's fp32 check sees the gradient too."""
    from transformer.errors import UserError
    from transformer.run import checkpoint_dirs

    run = tmp_path / "run"
    trainer = Trainer(lm_cfg("max_steps=20", "save_every=1", "peak_lr=1e30", f"model.preset={preset}"), run,
                      log=lambda *a: None)
    with pytest.raises(UserError, match=r"^update 1 \(learning rate 3.33e\+29\) made the weights unusable: their loss "
                                        r"or gradient is not finite even in fp32;.* no good checkpoint is left"):
        trainer.train()
    assert checkpoint_dirs(run) == []
