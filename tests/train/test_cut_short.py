"""A run the max_minutes clock stops before max_steps: it says so (a log line, and
``"finished": false`` in the stop record of metrics.jsonl), and the average of the last
checkpoints of its unfinished schedule is scored on the validation set as the best checkpoint
was, and kept only when it scores at least as well; else the run is read from
best.safetensors. A run that finishes its schedule averages as it always did.

The clock is faked: every reading of the trainer's clock is one second after the one
before, so each update counts exactly one training second and the cap stops the run at a
known update."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from transformer.run import checkpoint_dirs, load_model, resolve_weights
from transformer.run.weights import unique_state_dict
from transformer.train import trainer as trainer_module
from transformer.train.task import TranslationTask
from transformer.train.trainer import Trainer

# Updates 1..10, a checkpoint and an evaluation every 2, the last 3 checkpoints averaged.
RUN = ("max_steps=10", "save_every=2", "eval_every=2", "keep_last=5", "average_last=3")
CUT = "max_minutes=0.0916666"  # 5.5 s: the sixth update (6 s) reaches it
BEST, WORSE, BETTER = 20.0, 10.0, 30.0


@pytest.fixture
def fake_clock(monkeypatch) -> None:
    ticks = iter(range(10**6))
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))


def scoring(monkeypatch, averaged: float) -> list[float]:
    """Validation as it is (a real forward pass over the validation set with the weights it is
    given), except its BLEU: ``BEST`` for the trained model at every evaluation, ``averaged``
    for weights equal to those in averaged.safetensors. Returns the scores given to the
    averaged weights."""
    real, given = TranslationTask.validate, []

    def validate(self, model, device, amp_dtype):
        rec = real(self, model, device, amp_dtype)
        path = Path(self.cfg_run_dir) / "averaged.safetensors"
        is_average = path.is_file() and _equal(unique_state_dict(model), load_file(str(path)))
        rec["valid_bleu"] = averaged if is_average else BEST
        if is_average:
            given.append(averaged)
        return rec

    monkeypatch.setattr(TranslationTask, "validate", validate)
    return given


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k]) for k in a)


def train(make_cfg, run: Path, log, *overrides: str) -> dict:
    trainer = Trainer(make_cfg(*RUN, *overrides), run, log=log)
    trainer.task.cfg_run_dir = run  # where scoring() looks for the average
    return trainer.train()


def stop_record(run: Path) -> dict:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["event"] == "stop"
    return recs[-1]


def mean_of_last(run: Path, k: int) -> dict:
    files = [load_file(str(d / "model.safetensors")) for d in checkpoint_dirs(run)[-k:]]
    return {n: sum(f[n].double() for f in files).div(k).float() for n in files[0]}


def test_a_run_cut_short_by_the_clock_says_so(tmp_path, make_cfg, log, fake_clock):
    run = tmp_path / "run"
    result = train(make_cfg, run, log, CUT, "average_last=0")
    assert (result["step"], result["reason"], result["finished"]) == (6, "max_minutes", False)
    line = ("stopped by max_minutes (0.0916666) at update 6 of 10: the schedule did not finish; "
            "raise max_minutes to train the recipe's model")
    assert line in log
    stop = stop_record(run)
    assert (stop["step"], stop["reason"], stop["finished"]) == (6, "max_minutes", False)
    assert not (run / "averaged.safetensors").exists()


def test_a_worse_average_of_an_unfinished_schedule_is_not_kept(tmp_path, make_cfg, log, fake_clock, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    save_file({"stale": torch.zeros(1)}, str(run / "averaged.safetensors"))  # an earlier attempt's: must not survive
    given = scoring(monkeypatch, averaged=WORSE)
    result = train(make_cfg, run, log, CUT)
    assert (result["step"], result["finished"]) == (6, False)
    assert given == [WORSE]  # the average was scored, once
    assert not (run / "averaged.safetensors").exists()
    assert resolve_weights(run) == run / "best.safetensors"
    assert load_model(run)[1]["path"] == str(run / "best.safetensors")
    assert (f"the average of the last 3 checkpoints of the unfinished schedule scores validation BLEU 10.00, "
            f"below the best checkpoint's validation BLEU 20.00: not kept; the run loads {run / 'best.safetensors'}"
            in log)
    stop = stop_record(run)
    assert stop["finished"] is False and stop["averaged_kept"] is False and stop["loads"] == "best.safetensors"
    assert (stop["averaged_valid_bleu"], stop["best_valid_bleu"]) == (WORSE, BEST)


@pytest.mark.parametrize("averaged", [BETTER, BEST], ids=["better", "as-good"])
def test_an_average_at_least_as_good_is_kept(tmp_path, make_cfg, log, fake_clock, monkeypatch, averaged):
    run = tmp_path / "run"
    given = scoring(monkeypatch, averaged=averaged)
    train(make_cfg, run, log, CUT)
    assert given == [averaged]
    avg = load_file(str(run / "averaged.safetensors"))
    assert _equal(mean_of_last(run, 3), avg)  # checkpoints 2, 4 and 6
    assert resolve_weights(run) == run / "averaged.safetensors"
    assert (f"the average of the last 3 checkpoints of the unfinished schedule scores validation BLEU "
            f"{averaged:.2f}, at least the best checkpoint's validation BLEU 20.00: kept in "
            f"{run / 'averaged.safetensors'}; the run loads it" in log)
    stop = stop_record(run)
    assert stop["finished"] is False and stop["averaged_kept"] is True and stop["loads"] == "averaged.safetensors"


def test_a_finished_schedule_averages_as_before(tmp_path, make_cfg, log, fake_clock, monkeypatch):
    """max_steps reached (the cap never bites): the average is written and kept without being
    scored, even where it would score worse than the best checkpoint."""
    run = tmp_path / "run"
    given = scoring(monkeypatch, averaged=WORSE)
    result = train(make_cfg, run, log, "max_minutes=60")
    assert (result["step"], result["reason"], result["finished"]) == (10, "max_steps", True)
    assert given == []
    assert _equal(mean_of_last(run, 3), load_file(str(run / "averaged.safetensors")))  # 6, 8 and 10
    assert resolve_weights(run) == run / "averaged.safetensors"
    assert f"averaged 3 checkpoints -> {run / 'averaged.safetensors'}" in log
    assert not [line for line in log if "did not finish" in line or "unfinished" in line]
    stop = stop_record(run)
    assert stop["finished"] is True and "averaged_kept" not in stop


def test_the_clock_at_max_steps_itself_is_a_finished_schedule(tmp_path, make_cfg, log, fake_clock):
    run = tmp_path / "run"
    result = train(make_cfg, run, log, "max_minutes=0.1583333")  # 9.5 s: the clock runs out with update 10
    assert (result["step"], result["reason"], result["finished"]) == (10, "max_minutes", True)
    assert f"averaged 3 checkpoints -> {run / 'averaged.safetensors'}" in log
    assert not [line for line in log if "did not finish" in line]


def test_scoring_the_average_leaves_a_resumed_run_exact(tmp_path, make_cfg, log, fake_clock):
    """A run cut short (its average scored) and then resumed with time to finish reaches the
    weights and losses of the run never cut short, and then averages as a finished run."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(make_cfg, straight, log, "max_minutes=60")
    assert train(make_cfg, resumed, log, CUT)["step"] == 6
    assert any("unfinished schedule scores" in line for line in log)
    assert train(make_cfg, resumed, log, "max_minutes=60")["finished"] is True
    a = load_file(str(straight / "checkpoints/step-0000010/model.safetensors"))
    b = load_file(str(resumed / "checkpoints/step-0000010/model.safetensors"))
    assert _equal(a, b)
    losses = lambda run: [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()  # noqa: E731
                          if "event" not in json.loads(x)]
    assert losses(straight) == losses(resumed)
    assert _equal(load_file(str(straight / "averaged.safetensors")), load_file(str(resumed / "averaged.safetensors")))
