"""Opening a checkpoint never runs code: state.pt is read with weights_only=True. A crafted
pickle in a run directory is refused with a one-line error (and not skipped for an older
checkpoint, which would hide it); the state of older runs, which held numpy's RNG keys as
an ndarray, still loads."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer.cli import main
from transformer.errors import UserError
from transformer.train import checkpoint as ckpt
from transformer.train.trainer import Trainer

RUN = ("max_steps=4", "save_every=2", "keep_last=5")  # conftest's FOUR_STEPS


class _Payload:
    """Unpickling this calls ``open(MARKER, "w")``: a stand-in for any code in a pickle."""

    marker: Path

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.fixture
def crafted(four_steps_copy, tmp_path) -> tuple[Path, Path]:
    """A copy of the run whose newest state.pt carries the payload, and the payload's marker."""
    run = four_steps_copy
    marker = tmp_path / "code-ran"
    payload = _Payload()
    payload.marker = marker
    torch.save({"step": 4, "optimizer": payload}, run / "checkpoints/step-0000004/state.pt")
    return run, marker


def test_the_payload_would_run_under_a_plain_load(crafted):
    """The control: the file really carries code, which weights_only=False would run."""
    run, marker = crafted
    torch.load(run / "checkpoints/step-0000004/state.pt", weights_only=False)
    assert marker.exists()


def test_a_crafted_state_is_refused_not_executed(crafted, make_cfg):
    run, marker = crafted
    with pytest.raises(UserError) as e:
        Trainer(make_cfg(*RUN), run, log=lambda *a: None)
    msg = str(e.value)
    assert "state.pt: refused" in msg and "could run code" in msg and "\n" not in msg
    assert "step-0000004" in msg
    assert not marker.exists()
    assert (run / "checkpoints/step-0000004").is_dir()  # refused, not set aside and skipped


def test_train_command_refuses_it_in_one_line(crafted, write_config, tmp_path, capsys):
    run, marker = crafted
    config = write_config(tmp_path / "cfg.yaml", *RUN)
    assert main(["train", "--config", str(config), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("transformer train: error: ") and "refused" in err[0]
    assert not marker.exists()


def test_new_states_hold_only_tensors_and_plain_data(four_steps):
    state = torch.load(four_steps / "checkpoints/step-0000004/state.pt", weights_only=True)
    assert isinstance(state["rng"]["numpy"][1], torch.Tensor)


def test_an_older_runs_numpy_rng_state_still_loads_and_restores(four_steps, tmp_path):
    """Runs written before the change pickled np.random.get_state() (an ndarray): allowed by
    name, and the restored generator continues exactly."""
    ck = tmp_path / "step-0000004"
    shutil.copytree(four_steps / "checkpoints/step-0000004", ck)
    state = torch.load(ck / "state.pt", weights_only=True)
    np.random.seed(7)
    old_np = np.random.get_state()
    expected = np.random.rand(3)
    state["rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": old_np}
    torch.save(state, ck / "state.pt")
    with pytest.raises(Exception):  # the plain weights_only load cannot read it ...
        torch.load(ck / "state.pt", weights_only=True)
    loaded = ckpt.load_training_state(ck)  # ... the checkpoint reader can
    np.random.seed(0)
    ckpt.set_rng_state(loaded["rng"], torch.device("cpu"))
    assert np.array_equal(np.random.rand(3), expected)
