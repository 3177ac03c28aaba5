"""A restricted output vocabulary (``ModelConfig.output_vocab_size`` + ``set_output_ids``):
the same logits as the full model at the ids it keeps, -inf elsewhere, so no search can
produce an id outside it, and the training loss over its columns only."""
from __future__ import annotations

import pytest
import torch

from transformer.decode import beam_search, greedy_search, pad_batch
from transformer.train.checkpoint import average_checkpoints, load_model, save_weights
from transformer.train.loss import label_smoothed_nll_loss
from transformer.train.step import paper_adam, train_step
from transformer.data.batching import collate


@pytest.mark.parametrize("overrides", [{}, dict(output_bias=True), dict(tie_embeddings=False, output_bias=True)],
                         ids=["tied", "bias", "untied-bias"])
def test_logits_equal_the_full_models_at_kept_ids_and_minus_inf_elsewhere(rand_tokens, overrides, make_model,
                                                                          output_ids):
    full = make_model(seed=3, **overrides)
    model = full.with_output_ids(output_ids)
    src, tgt = rand_tokens([6, 4]), rand_tokens([5, 3])
    a, b = full(src, tgt), model(src, tgt)
    ids = torch.tensor(output_ids)
    others = torch.tensor([i for i in range(full.cfg.vocab_size) if i not in output_ids])
    assert (a[..., ids] - b[..., ids]).abs().max().item() < 1e-6
    assert torch.isneginf(b[..., others]).all()
    # training's path: only the output vocabulary's columns, in output_ids order
    select = tgt != 0
    assert (model(src, tgt, select) - a[select][:, ids]).abs().max().item() < 1e-6
    assert model.output_positions(torch.tensor([2, 3, 5, 12, 4])).tolist() == [0, 1, 2, 7, -1]


def test_untied_projection_has_one_row_per_output_id(make_model, output_ids):
    model = make_model(tie_embeddings=False, output_vocab_size=8, output_bias=True)
    assert model.out_proj.weight.shape == (8, 16) and model.out_bias.shape == (8,)
    weight, bias = model.dense_output_layer()
    assert weight.shape == (13, 16) and bias.shape == (13,)
    ids = model.output_ids
    assert torch.equal(weight[ids], model.out_proj.weight) and torch.equal(bias[ids], model.out_bias)
    others = torch.tensor([i for i in range(13) if i not in output_ids])
    assert (bias[others] == -1e4).all() and (weight[others] == 0).all()


def test_bad_output_ids_are_refused(make_model):
    model = make_model(output_vocab_size=8)
    with pytest.raises(ValueError, match="expected 8 distinct ids"):
        model.set_output_ids([2, 3, 4])
    with pytest.raises(ValueError, match="include eos_id"):
        model.set_output_ids(range(3, 11))
    with pytest.raises(ValueError, match="output_vocab_size"):
        make_model(output_vocab_size=14)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_searches_produce_only_output_ids(rand_tokens, search, make_model, output_ids):
    """The full model's favourite ids lie outside the output vocabulary; the restricted
    twin never produces them, whatever the search."""
    full = make_model(seed=5, output_bias=True)
    with torch.no_grad():
        full.out_bias.zero_()
        full.out_bias[[4, 7, 10]] = 5.0  # ids the restricted model lacks
    model = full.with_output_ids(output_ids)
    src = pad_batch([[3, 4, 5, 6, 2], [7, 8, 2], [9, 10, 11, 12, 3, 2]], 0)
    run = greedy_search if search == "greedy" else (lambda m, s, **kw: beam_search(m, s, beam_size=4, **kw))
    produced = {t for hyps in run(full, src, max_len_a=0.0, max_len_b=8) for t in hyps[0].tokens}
    assert produced & {4, 7, 10}  # the unrestricted model does say them
    for hyps in run(model, src, max_len_a=0.0, max_len_b=8):
        for h in hyps:
            assert set(h.tokens) <= set(output_ids), h.tokens


def test_train_step_loss_is_label_smoothed_ce_over_the_output_columns(make_model):
    model = make_model(seed=2, output_vocab_size=8).train()
    pairs = [([3, 4, 5], [3, 5, 6, 8]), ([7, 8], [9, 11, 12]), ([4, 4, 10, 3], [12, 3])]
    batch = collate(pairs, 0, 1, 2)
    select = batch.tgt_out != 0
    with torch.no_grad():
        logits = model(batch.src, batch.tgt_in, select)
        gold = model.output_positions(batch.tgt_out[select])
        want, want_nll, n = label_smoothed_nll_loss(logits, gold, 0.1, -1)
    assert (gold >= 0).all() and int(n) == int(select.sum())
    opt = paper_adam(model.parameters())
    stats = train_step(model, [batch], opt, 1e-3, epsilon=0.1)
    assert stats.loss == pytest.approx(float(want) / int(n), rel=1e-5)
    assert stats.nll == pytest.approx(float(want_nll) / int(n), rel=1e-5)
    assert not stats.skipped


def test_saved_loaded_and_averaged_models_keep_the_output_ids(tmp_path, make_model, output_ids):
    a = make_model(seed=1, output_vocab_size=8)
    b = make_model(seed=2, output_vocab_size=8)
    save_weights(a, tmp_path / "a.safetensors")
    save_weights(b, tmp_path / "b.safetensors")
    loaded, _ = load_model(tmp_path / "a.safetensors")
    assert loaded.output_ids.tolist() == output_ids
    assert torch.equal(loaded.output_index, a.output_index)
    average_checkpoints([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], tmp_path / "avg.safetensors")
    avg, _ = load_model(tmp_path / "avg.safetensors")
    assert avg.output_ids.tolist() == output_ids and avg.output_ids.dtype == torch.long
    w = (a.tgt_embed.weight + b.tgt_embed.weight) / 2
    assert (avg.tgt_embed.weight - w).abs().max().item() < 1e-6
    other = make_model(seed=2, output_vocab_size=8)
    other.set_output_ids([2, 3, 4, 5, 6, 7, 8, 9])
    save_weights(other, tmp_path / "c.safetensors")
    from transformer.errors import UserError
    with pytest.raises(UserError, match="output_ids differs"):
        average_checkpoints([tmp_path / "a.safetensors", tmp_path / "c.safetensors"], tmp_path / "bad.safetensors")
