"""Damaged run directories: a truncated or corrupt newest checkpoint is set aside with a
warning and the run resumes from the one before (with no older one: a clear error); a
checkpoint of another config is refused even when an older one exists; a torn last line of
metrics.jsonl and the temporaries of a crash are cleaned up on resume."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fault_helpers import check_run_dir

from transformer.errors import UserError
from transformer.run import checkpoint_dirs, latest_checkpoint
from transformer.train import checkpoint as ckpt
from transformer.train.trainer import Trainer

RUN = ("max_steps=4", "save_every=2", "keep_last=5")  # conftest's FOUR_STEPS


@pytest.fixture
def run(four_steps_copy) -> Path:
    """Checkpoints at steps 2 and 4."""
    return four_steps_copy


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", ["state.pt truncated", "state.pt empty", "model.safetensors truncated",
                                    "model.safetensors garbage"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(run, make_cfg, log, damage):
    name, how = damage.split()
    target = run / "checkpoints/step-0000004" / name
    if how == "truncated":
        _truncate(target)
    elif how == "empty":
        target.write_bytes(b"")
    else:
        target.write_bytes(b"\x00garbage" * 100)
    trainer = Trainer(make_cfg(*RUN, "max_steps=6"), run, log=log)
    assert trainer.step == 2
    warning = [x for x in log if x.startswith("warning:")]
    assert len(warning) == 1 and str(target) in warning[0] and "resuming from the checkpoint before it" in warning[0]
    assert "resumed from" in log.text() and "step-0000002 (step 2)" in log.text()
    # Set aside for inspection, out of the way of translation, resume and keep_last.
    assert (run / "checkpoints/corrupt-step-0000004").is_dir()
    assert [p.name for p in checkpoint_dirs(run)] == ["step-0000002"]
    assert trainer.train()["step"] == 6
    assert [p.name for p in checkpoint_dirs(run)] == ["step-0000002", "step-0000004", "step-0000006"]
    check_run_dir(run, finished=True)


def test_only_checkpoint_truncated_is_a_clear_error(run, make_cfg):
    shutil.rmtree(run / "checkpoints/step-0000002")
    _truncate(run / "checkpoints/step-0000004/state.pt")
    with pytest.raises(UserError) as e:
        Trainer(make_cfg(*RUN), run, log=lambda *a: None)
    msg = str(e.value)
    assert "step-0000004/state.pt" in msg and "cannot read the training state" in msg and "\n" not in msg
    assert (run / "checkpoints/step-0000004").is_dir()  # nothing moved when nothing can replace it


def test_checkpoint_of_another_config_is_refused_not_skipped(run, make_cfg, tmp_path):
    """The newest checkpoint's weights replaced by a model of another size: refused, even
    though an older, fitting checkpoint exists (a wrong model is never silently skipped)."""
    other = tmp_path / "other"
    Trainer(make_cfg("max_steps=1", "model.d_model=48", "model.n_heads=2"), other, log=lambda *a: None).train()
    shutil.copy(latest_checkpoint(other) / "model.safetensors", run / "checkpoints/step-0000004")
    with pytest.raises(UserError, match="another model config or vocabulary"):
        Trainer(make_cfg(*RUN), run, log=lambda *a: None)


def test_torn_metrics_line_is_repaired_and_rolled_back_steps_dropped(run, make_cfg, log):
    """A crash after step 5 was logged but before its checkpoint, in the middle of a line."""
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "loss": 1.0}) + "\n")
        f.write('{"step": 6, "lo')
    trainer = Trainer(make_cfg(*RUN, "max_steps=6"), run, log=log)
    assert "metrics.jsonl: removed 1 record(s) of steps after 4" in log.text() and "torn last line" in log.text()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(x)["step"] <= 4 for x in lines)
    trainer.train()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "event" not in r] == [1, 2, 3, 4, 5, 6]


def test_repair_metrics_unit(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert ckpt.repair_metrics(path, 3) == (0, False)  # no file: nothing to do
    path.write_text('{"step": 1}\n{"event": "eval", "step": 2}\n{"note": "no step"}\n{"step": 4}\n')
    before = path.read_bytes()
    assert ckpt.repair_metrics(path, 4) == (0, False) and path.read_bytes() == before  # untouched
    assert ckpt.repair_metrics(path, 1) == (2, False)
    assert path.read_text() == '{"step": 1}\n{"note": "no step"}\n'
    path.write_text('{"step": 1}\nnot json\n{"st')
    assert ckpt.repair_metrics(path, 9) == (1, True)
    assert path.read_text() == '{"step": 1}\n'


def test_leftovers_of_a_crash_are_removed(run, make_cfg):
    leftovers = [run / ".prepare.abc123", run / ".config.yaml.x1.tmp", run / ".best.safetensors.x2.tmp",
                 run / ".learning_curve.png.x3.tmp", run / "checkpoints/.old-step-0000001",
                 run / "checkpoints/.step-0000009.q"]
    for p in leftovers:
        if p.suffix in (".tmp", ".png"):
            p.write_bytes(b"partial")
        else:
            p.mkdir()
            (p / "subwords.model").write_bytes(b"partial")
    Trainer(make_cfg(*RUN), run, log=lambda *a: None)
    assert not [p for p in leftovers if p.exists()]
    check_run_dir(run)


def test_every_kind_of_temporary_is_swept_at_the_next_start(run, make_cfg):
    """One leftover of each temporary name a writer of the run directory makes (run.files's
    ``.NAME.XXXX.tmp`` for every file of the run, checkpoint folders, .prepare.*) is removed
    by the next start. (Compiled decoding steps are built in the user's cache, not the run:
    their leftovers are swept there, tests/faults/test_package_trust.py.)"""
    from transformer.run import layout

    names = [layout.CONFIG, layout.BEST, layout.AVERAGED, layout.METRICS, layout.CURVE, layout.SUBWORDS,
             "subwords.vocab", "chars.json"]
    leftovers = [run / f".{name}.k3x9_q.tmp" for name in names]
    leftovers += [run / ".prepare.a1b2", run / "checkpoints/.step-0000006.zz.tmp", run / "checkpoints/.old-step-0000002"]
    for p in leftovers:
        if p.name.startswith((".prepare", ".step", ".old")):
            p.mkdir()
            (p / "x").write_bytes(b"partial")
        else:
            p.write_bytes(b"partial")
    Trainer(make_cfg(*RUN), run, log=lambda *a: None)
    assert [p.name for p in leftovers if p.exists()] == []
    check_run_dir(run)


def test_subwords_are_learned_aside_and_moved_in_complete(tmp_path, make_cfg):
    """A crash while sentencepiece writes leaves at most a .prepare.* folder (removed by the
    next start), never a truncated subwords.model that a restart would reuse."""
    run = tmp_path / "run"
    (run / ".prepare.crashed").mkdir(parents=True)
    (run / ".prepare.crashed" / "subwords.model").write_bytes(b"\x0a\x05trunc")
    lines: list[str] = []
    Trainer(make_cfg("max_steps=1"), run, log=lines.append)
    assert not list(run.glob(".prepare.*"))
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "subwords.model", "subwords.vocab"]
    assert any(f"-> {run / 'subwords.model'}" in x for x in lines), lines  # the final path, not the staging one


@pytest.mark.parametrize("forged", [{"vocab_size": 10**9}, {"n_layers": 10**5, "d_ff": 10**5},
                                    {"max_len": 10**10}])
def test_weights_declaring_a_model_larger_than_the_file_are_refused_before_it_is_built(run, forged, monkeypatch):
    """A weights file's metadata describes the model it rebuilds; forged to a huge one, the
    model was built (all the memory, or a crash) before any shape was compared."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    import transformer.run.weights as weights
    from transformer.run import load_model

    good = run / "checkpoints/step-0000004/model.safetensors"
    with safe_open(str(good), framework="pt") as f:
        meta = f.metadata()
    forged_path = run / "forged.safetensors"
    save_file(load_file(str(good)), str(forged_path),
              metadata={**meta, "model_config": json.dumps({**json.loads(meta["model_config"]), **forged})})
    monkeypatch.setattr(weights, "build_model", lambda cfg: pytest.fail("built before the sizes were checked"))
    with pytest.raises(UserError) as e:
        load_model(forged_path)
    assert str(e.value).startswith(f"{forged_path}: its metadata describes a model of at least ")
    assert "not built (the metadata was damaged or edited)" in str(e.value)
    monkeypatch.undo()
    model, _ = load_model(good)  # the file it was made from loads as before
    assert sum(p.numel() for p in model.parameters()) > 0
