"""``restrict_output: true``: the model's logits cover exactly the subwords of the target
training text (and EOS); training, validation, resuming and averaging work with it."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from transformer.data.batching import TokenBatchSampler, collate, example_lengths
from transformer.errors import UserError
from transformer.train.checkpoint import average_checkpoints, load_model
from transformer.train.trainer import Trainer

COMMON = ("restrict_output=true", "model.dropout=0.1", "save_every=3", "keep_last=10")


def quiet(*args, **kwargs) -> None:
    pass


def test_output_ids_are_the_target_training_subwords(tmp_path, make_cfg, log):
    trainer = Trainer(make_cfg(*COMMON, "max_steps=6"), tmp_path / "run", log=log)
    model, data = trainer.model, trainer.data
    want = sorted({i for _, t in data.train for i in t} | {model.cfg.eos_id})
    assert model.output_ids.tolist() == want
    assert len(want) < data.subwords.vocab_size  # the source-only subwords are left out
    assert f"output vocabulary: {len(want)} of {data.subwords.vocab_size} subwords" in log.text()
    result = trainer.train()
    assert result["step"] == 6
    loss = trainer.validation_loss()
    assert math.isfinite(loss) and 0 < loss < 10
    loaded, _ = load_model(tmp_path / "run" / "checkpoints" / "step-0000006")
    assert loaded.output_ids.tolist() == want
    avg = average_checkpoints([tmp_path / "run/checkpoints/step-0000003", tmp_path / "run/checkpoints/step-0000006"],
                              tmp_path / "avg.safetensors")
    assert load_model(avg)[0].output_ids.tolist() == want


def test_resume_is_bit_exact(tmp_path, make_cfg):
    straight, half = tmp_path / "straight", tmp_path / "half"
    Trainer(make_cfg(*COMMON, "max_steps=6"), straight, log=quiet).train()
    Trainer(make_cfg(*COMMON, "max_steps=3"), half, log=quiet).train()
    assert Trainer(make_cfg(*COMMON, "max_steps=6"), half, log=quiet).train()["step"] == 6
    a = load_file(str(straight / "checkpoints/step-0000006/model.safetensors"))
    b = load_file(str(half / "checkpoints/step-0000006/model.safetensors"))
    assert a.keys() == b.keys() and "output_ids" in a
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_validation_loss_leaves_out_ids_the_output_lacks(tmp_path, make_cfg):
    """A validation target subword outside the output vocabulary cannot be scored (its
    logit is -inf): the loss is the mean over the other tokens, not inf."""
    trainer = Trainer(make_cfg(*COMMON, "max_steps=1", "precision=fp32"), tmp_path / "run", log=quiet)
    model, sw = trainer.model, trainer.data.subwords
    pairs = [(sw.encode(s), sw.encode(t)) for s, t in trainer.data.valid]
    gone = max(((t[0], sum(tt.count(t[0]) for _, tt in pairs)) for _, t in pairs), key=lambda x: x[1])[0]
    unused = next(i for i in range(3, sw.vocab_size) if i not in model.output_ids.tolist())
    ids = [unused if i == gone else i for i in model.output_ids.tolist()]
    model.set_output_ids(ids)  # the validation text's commonest first subword is now outside
    model.eval()
    nll_sum, n = 0.0, 0
    for idx in TokenBatchSampler(example_lengths(pairs), 10_000, 0, shuffle=False, length_noise=0):
        b = collate([pairs[i] for i in idx], 0, 1, 2)
        with torch.no_grad():
            logp = model(b.src, b.tgt_in).float().log_softmax(-1)
        keep = (b.tgt_out != 0) & (b.tgt_out != gone)
        nll_sum -= float(logp.gather(-1, b.tgt_out.unsqueeze(-1)).squeeze(-1)[keep].sum())
        n += int(keep.sum())
    assert trainer.validation_loss() == pytest.approx(nll_sum / n, rel=1e-4)


@pytest.mark.parametrize("overrides, message", [
    (("model.output_vocab_size=50",), "use restrict_output: true instead"),
    (("restrict_output=true", "subword_dropout=0.1"), "restrict_output needs subword_dropout 0"),
])
def test_bad_combinations_are_refused(make_cfg, overrides, message):
    with pytest.raises(UserError, match=message):
        make_cfg(*overrides)
