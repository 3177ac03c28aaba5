"""`compile_loss: true`: training runs its loss through the kernels torch.compile generates,
with the same losses as the eager loss; without it the eager loss runs."""
from __future__ import annotations

import pytest

from transformer.train.trainer import Trainer

STEPS = ("max_steps=4", "precision=fp32", "log_every=1")


def test_compiled_loss_trains_like_the_eager_loss(make_cfg, tmp_path, log, metrics):
    compiled = Trainer(make_cfg(*STEPS, "compile_loss=true"), tmp_path / "compiled", log=log)
    assert compiled.loss_kernels is not None
    assert "loss: compiled kernels (compile_loss: true)" in log.text()
    compiled.train()
    eager = Trainer(make_cfg(*STEPS), tmp_path / "eager", log=lambda *a: None)
    assert eager.loss_kernels is None
    eager.train()
    steps = lambda run: [r for r in metrics(run) if "loss" in r and "event" not in r]  # noqa: E731
    got, ref = steps(tmp_path / "compiled"), steps(tmp_path / "eager")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3, 4]
    for c, e in zip(got, ref):
        assert c["loss"] == pytest.approx(e["loss"], rel=1e-4)
        assert c["nll"] == pytest.approx(e["nll"], rel=1e-4)
