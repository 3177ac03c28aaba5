"""Resume exactness: 8 steps straight == 4 steps, then a new Trainer on the same run
directory continuing to 8. Dropout is on, so the RNG state matters; the data position and
the learning-rate schedule must continue too."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transformer.train.trainer import Trainer

STEP8 = "checkpoints/step-0000008"
# save_every=2 puts checkpoints at 2, 4, 6, 8; eval_every=1000 keeps evaluation out of the loop.
COMMON = ("model.dropout=0.1", "save_every=2", "keep_last=10")


def weights(run_dir: Path, ckpt: str = STEP8) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / ckpt / "model.safetensors"))


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


def train_records(recs: list[dict]) -> dict[int, dict]:
    return {r["step"]: r for r in recs if "event" not in r and "loss" in r}


@pytest.fixture(scope="module")
def straight(tmp_path_factory, make_cfg) -> Path:
    """8 steps in one go."""
    run = tmp_path_factory.mktemp("straight")
    Trainer(make_cfg(*COMMON, "max_steps=8"), run, log=lambda *a: None).train()
    return run


@pytest.fixture
def half(tmp_path, make_cfg) -> Path:
    """The same run stopped after 4 steps."""
    run = tmp_path / "resumed"
    result = Trainer(make_cfg(*COMMON, "max_steps=4"), run, log=lambda *a: None).train()
    assert result["step"] == 4 and result["reason"] == "max_steps"
    return run


def test_resume_is_bit_exact(straight, half, make_cfg, log, metrics):
    trainer = Trainer(make_cfg(*COMMON, "max_steps=8"), half, log=log)
    assert trainer.step == 4
    assert "resumed from" in log.text() and "step-0000004" in log.text()
    # The data position restored is the one the straight run had after 4 updates.
    saved = torch.load(straight / "checkpoints/step-0000004/state.pt", weights_only=False)
    assert trainer.sampler.state_dict() == saved["sampler"]
    result = trainer.train()
    assert result["step"] == 8

    a, b = weights(straight), weights(half)
    assert same_weights(a, b), "weights after resuming differ from the uninterrupted run"

    # The optimizer continued (Adam's step count is 8, not 4) and so did the schedule.
    state = torch.load(half / STEP8 / "state.pt", weights_only=False)
    assert all(int(s["step"]) == 8 for s in state["optimizer"]["state"].values())
    want, got = train_records(metrics(straight)), train_records(metrics(half))
    assert sorted(got) == list(range(1, 9))
    for step in range(5, 9):
        assert got[step]["lr"] == want[step]["lr"], f"learning rate at step {step}"
        assert got[step]["loss"] == want[step]["loss"], f"loss at step {step} (same batch, same dropout)"
    assert got[5]["lr"] > got[4]["lr"]  # still warming up: the schedule did not restart


@pytest.mark.parametrize("perturb", ["rng", "data_position"])
def test_resume_check_is_sensitive(straight, half, make_cfg, perturb):
    """Controls for the test above: without the restored RNG state or data position the
    weights differ, so bit-identity there really proves both were restored."""
    trainer = Trainer(make_cfg(*COMMON, "max_steps=8"), half, log=lambda *a: None)
    if perturb == "rng":
        torch.manual_seed(12345)
    else:
        trainer.sampler.load_state_dict({**trainer.sampler.state_dict(), "batch_in_epoch": 0})
    trainer.train()
    assert not same_weights(weights(straight), weights(half))


def test_resume_after_finished_run_extends_it(straight, tmp_path, make_cfg, log):
    """Raising max_steps on a finished run continues from its last checkpoint."""
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    result = Trainer(make_cfg(*COMMON, "max_steps=10"), run, log=log).train()
    assert result["step"] == 10
    assert "step-0000008" in log.text()
    assert (run / "checkpoints/step-0000010/model.safetensors").is_file()


def test_resume_at_max_steps_trains_nothing(straight, tmp_path, make_cfg):
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    before = weights(run)
    result = Trainer(make_cfg(*COMMON, "max_steps=8"), run, log=lambda *a: None).train()
    assert result["step"] == 8
    assert same_weights(before, weights(run))
    assert not (run / "checkpoints/step-0000009").exists()


@pytest.mark.parametrize("max_steps", [8, 5])
def test_finished_run_resumed_at_or_past_max_steps_writes_nothing(straight, tmp_path, make_cfg, log, max_steps):
    """No second evaluation, checkpoint, average or stop record (as fairseq's max_update):
    one line says there is nothing to train and how to train further."""
    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    cfg = make_cfg(*COMMON, f"max_steps={max_steps}", "eval_every=3", "average_last=2")

    def files() -> dict:  # but config.yaml, which a resume rewrites with the options that may change
        return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "config.yaml"}

    before = files()
    result = Trainer(cfg, run, log=log).train()
    assert result["step"] == 8 and result["finished"]
    assert f"already at step 8 >= max_steps {max_steps}: nothing to train (raise max_steps" in log.text()
    after = files()
    assert after == before


@pytest.mark.parametrize("reason,trains", [("max_minutes", False), ("SIGTERM", True)])
def test_run_stopped_at_step_8_resumed_with_max_steps_5(straight, tmp_path, make_cfg, metrics, reason, trains):
    """A run the clock stopped has written its end (final evaluation, checkpoint): nothing
    more; one a signal stopped has not, and a resume ends its schedule."""
    import json

    run = tmp_path / "copy"
    shutil.copytree(straight, run)
    recs = metrics(run)
    assert recs[-1]["event"] == "stop" and recs[-1]["step"] == 8
    recs[-1].update(reason=reason, finished=False)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    Trainer(make_cfg(*COMMON, "max_steps=5"), run, log=lambda *a: None).train()
    stops = [r for r in metrics(run) if r.get("event") == "stop"]
    assert len(stops) == (2 if trains else 1)


def test_cooldown_added_on_resume(half, make_cfg, metrics):
    """A cooldown can be decided later (warmup-stable-decay): a run trained 4 steps without
    one resumes with ``cooldown`` and a new ``max_steps``, and its learning rate falls
    linearly to 1/cooldown of the schedule's value at the last update."""
    from transformer.train import inverse_sqrt_lr

    cfg = make_cfg(*COMMON, "max_steps=8", "cooldown=3")
    assert Trainer(cfg, half, log=lambda *a: None).train()["step"] == 8
    got = train_records(metrics(half))
    for step in range(1, 9):
        base = inverse_sqrt_lr(step, cfg.peak_lr, cfg.warmup)
        factor = {6: 1.0, 7: 2 / 3, 8: 1 / 3}.get(step, 1.0)
        assert got[step]["lr"] == pytest.approx(base * factor), f"learning rate at step {step}"


def test_dropout_ramp_in_training_and_resume(straight, tmp_path, make_cfg, metrics):
    """``dropout_ramp``: every P_drop site of the model gets the ramped probability of each
    update (logged), the weights differ from the fixed-dropout run, and a resumed run
    continues the ramp exactly."""
    from transformer.model.dropout import Dropout
    from transformer.train import dropout_ramp

    common = (*COMMON, "dropout_ramp=6", "dropout_start=0.4", "log_every=1")
    run = tmp_path / "ramp"
    trainer = Trainer(make_cfg(*common, "max_steps=8"), run, log=lambda *a: None)
    trainer.train()
    sites = [m for m in trainer.model.modules() if isinstance(m, Dropout)]
    assert len(sites) > 8 and all(m.p == pytest.approx(0.1) for m in sites)  # ended at model.dropout
    got = train_records(metrics(run))
    assert [got[s]["dropout"] for s in range(1, 9)] == pytest.approx([0.4 - 0.05 * s for s in range(1, 7)] + [0.1, 0.1])
    assert got[3]["dropout"] == pytest.approx(dropout_ramp(3, 0.4, 0.1, 6))
    assert not same_weights(weights(straight), weights(run))  # the ramp changed the masks
    assert "dropout" not in train_records(metrics(straight))[8]

    half = tmp_path / "ramp-half"
    Trainer(make_cfg(*common, "max_steps=4"), half, log=lambda *a: None).train()
    Trainer(make_cfg(*common, "max_steps=8"), half, log=lambda *a: None).train()
    assert same_weights(weights(run), weights(half))


def test_fp16_on_the_cpu_scales_the_loss_and_resumes_the_scale(tmp_path, make_cfg):
    """fp16 autocast without loss scaling flushes small gradients to zero; the CPU trained so
    (the GradScaler was made for CUDA only). Its scale is saved and restored like CUDA's."""
    run = tmp_path / "run"
    trainer = Trainer(make_cfg("precision=fp16", "max_steps=3", "save_every=3"), run, log=lambda *a: None)
    assert trainer.amp_dtype == torch.float16
    assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.scaler.is_enabled()
    assert trainer.train()["step"] == 3
    saved = torch.load(run / "checkpoints/step-0000003/state.pt", weights_only=True)["scaler"]
    assert saved["scale"] == trainer.scaler.get_scale() > 1
    resumed = Trainer(make_cfg("precision=fp16", "max_steps=4", "save_every=3"), run, log=lambda *a: None)
    assert resumed.step == 3 and resumed.scaler.get_scale() == saved["scale"]
    assert resumed.train()["step"] == 4


@pytest.fixture
def files_run(tmp_path, corpus, monkeypatch, cli) -> tuple[Path, Path]:
    """A run started in start/ with a config whose data paths are relative to it (copies of
    the corpus there), stopped after 2 updates: (the start folder, the run)."""
    start = tmp_path / "start"
    start.mkdir()
    for key in ("train_src", "train_tgt"):
        shutil.copyfile(corpus[key], start / corpus[key].name)
    config = start / "own.yaml"
    config.write_text(f"dataset: files\ntrain_src: {corpus['train_src'].name}\ntrain_tgt: {corpus['train_tgt'].name}\n"
                      "valid_size: 4\nvocab_size: 120\nmodel: {preset: toy}\nmax_tokens: 256\nwarmup: 8\n"
                      "progress: false\nthreads: 1\neval_every: 1000\nsave_every: 2\n", encoding="utf-8")
    monkeypatch.chdir(start)
    assert cli("train", "--config", "own.yaml", "--out", "run", "--set", "max_steps=2").code == 0
    return start, start / "run"


def test_a_run_resumes_from_another_folder_with_its_files_named_from_there(files_run, corpus, tmp_path, monkeypatch,
                                                                         cli, one_line_error):
    """Started with paths relative to start/, the run resumes from elsewhere: the same config
    says where to go, and the files named from there (absolute or relative) are accepted, the
    checkpoint recording their content. It was 'pairs.en: file not found', then 'holds a run
    with a different config (train_src, train_tgt)': no way to resume but from start/."""
    start, run = files_run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    src, tgt = corpus["train_src"].name, corpus["train_tgt"].name
    one_line_error(cli("train", "--config", start / "own.yaml", "--out", run, "--set", "max_steps=4"), "train",
                   f"train_src {src}: file not found from {elsewhere}", "relative to the folder training starts in",
                   "--set train_src=")
    assert (run / "checkpoints" / "step-0000002").is_dir() and not (run / "checkpoints" / "step-0000004").exists()
    resumed = cli("train", "--config", start / "own.yaml", "--out", run, "--set", "max_steps=4",
                  "--set", f"train_src={start / src}", "--set", f"train_tgt=../start/{tgt}")
    assert resumed.code == 0, resumed.err
    assert "resumed from" in resumed.out and (run / "checkpoints" / "step-0000004").is_dir()


@pytest.mark.parametrize("change", ["edited", "another-file", "tsv"])
def test_a_run_resumed_on_other_data_is_refused(files_run, corpus, cli, one_line_error, change):
    """The data a run trained on, edited or replaced, is refused by content in one line (the run
    went on silently on other pairs, its data position and best BLEU those of the old ones);
    the run is left as it was."""
    start, run = files_run
    src = start / corpus["train_src"].name
    sets = ["--set", "max_steps=4"]
    if change == "edited":
        src.write_text(src.read_text(encoding="utf-8").replace(" ", "  ", 1), encoding="utf-8")
    elif change == "another-file":
        lines = src.read_text(encoding="utf-8").splitlines()
        (start / "other.src").write_text("".join(line + "\n" for line in lines[1:] + lines[:1]), encoding="utf-8")
        sets += ["--set", "train_src=other.src"]
    else:
        pairs = zip(src.read_text(encoding="utf-8").splitlines(),
                    (start / corpus["train_tgt"].name).read_text(encoding="utf-8").splitlines())
        (start / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
        sets += ["--set", "train_src=pairs.tsv", "--set", "train_tgt=null"]
    config_before = (run / "config.yaml").read_bytes()
    result = cli("train", "--config", "own.yaml", "--out", "run", *sets)
    one_line_error(result, "train", "not the data the run trained on", "--set init_from=run")
    assert ("train_tgt (none)" in result.err) == (change == "tsv")
    assert (run / "config.yaml").read_bytes() == config_before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000002"]
