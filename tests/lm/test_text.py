"""The token stream: the split, the random training windows (reproducible, resumable and
sharded), the fixed validation windows, nanoGPT's cosine schedule and AdamW's groups."""
from __future__ import annotations

import math

import pytest
import torch

from transformer.model.config import ModelConfig
from transformer.data.text import WindowSampler, read_texts, split_text, validation_windows, windows
from transformer.model import build_model
from transformer.train.schedule import cosine_lr
from transformer.train.update import make_optimizer


def test_split_is_nanogpts_contiguous_90_10():
    text = "".join(chr(65 + i % 26) for i in range(1001))
    train, valid = split_text(text, 0.1)
    assert train == text[: int(1001 * 0.9)] and valid == text[int(1001 * 0.9):]
    assert split_text(text, 0.0) == (text, "")


def test_files_are_one_stream_in_order(tmp_path):
    (tmp_path / "a.txt").write_text("first\n")
    (tmp_path / "b.txt").write_text("second")
    assert read_texts([tmp_path / "a.txt", tmp_path / "b.txt"]) == "first\nsecond"


def test_a_gzipped_training_file_is_read_as_its_text(tmp_path):
    import gzip

    (tmp_path / "a.txt").write_text("first\n")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress("sécond 你好".encode()))
    assert read_texts([tmp_path / "a.txt", tmp_path / "b.txt.gz"]) == "first\nsécond 你好"


def test_windows_are_the_stream_and_its_next_tokens():
    stream = torch.arange(100)
    b = windows(stream, torch.tensor([0, 10, 83]), 16)
    assert b.x.shape == b.y.shape == (3, 16)
    assert torch.equal(b.y, b.x + 1) and b.x[2, -1] == 98 and b.y[2, -1] == 99
    assert b.inputs == (b.x,) and b.tgt_out is b.y and b.n_tgt_tokens == 48


def draws(sampler: WindowSampler, n: int) -> list[list[int]]:
    return [sampler.next_starts().tolist() for _ in range(n)]


def test_window_draws_are_reproducible_and_resume_exactly():
    a = WindowSampler(1000, 16, 4, seed=3)
    first = draws(a, 6)
    assert first == draws(WindowSampler(1000, 16, 4, seed=3), 6)
    assert first != draws(WindowSampler(1000, 16, 4, seed=4), 6)
    assert all(0 <= s <= 1000 - 17 for batch in first for s in batch)
    b = WindowSampler(1000, 16, 4, seed=3)
    draws(b, 2)
    state = b.state_dict()
    assert state == {"epoch": 0, "batch_in_epoch": 2, "seed": 3}
    c = WindowSampler(1000, 16, 4, seed=99)
    c.load_state_dict(state)
    assert draws(c, 4) == first[2:]


def test_ranks_share_out_the_draws_of_one_process():
    one = draws(WindowSampler(500, 8, 2, seed=1), 6)
    rank0, rank1 = (draws(WindowSampler(500, 8, 2, seed=1, num_shards=2, shard_index=r), 3) for r in (0, 1))
    assert one[0::2] == rank0 and one[1::2] == rank1


@pytest.mark.parametrize("n", [33, 34, 40, 48, 49])
def test_validation_windows_score_every_token_once(n):
    scored = []
    for start, first in validation_windows(n, 16):
        assert 0 <= start and start + 16 + 1 <= n
        scored += list(range(start + 1 + first, start + 17))
    assert scored == list(range(1, n))


def test_cosine_schedule_is_nanogpts_get_lr():
    def get_lr(it, lr=1e-3, min_lr=1e-4, warmup=100, decay=2000):  # nanoGPT's train.py
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > decay:
            return min_lr
        coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup)))
        return min_lr + coeff * (lr - min_lr)

    for step in (1, 2, 100, 101, 102, 1050, 1999, 2000, 2001, 2002, 5000):
        assert cosine_lr(step, 1e-3, 1e-4, 100, 2000) == pytest.approx(get_lr(step - 1), rel=1e-12)
    assert cosine_lr(1, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3 / 101)
    assert cosine_lr(101, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3)  # the peak
    assert cosine_lr(2001, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-4)  # the floor


def test_adamw_decays_matrices_and_embeddings_only():
    model = build_model(ModelConfig.preset("nanogpt-char", vocab_size=20, n_layers=1, bias=True))
    opt = make_optimizer(model, "adamw", 0.1, [0.9, 0.99])
    assert isinstance(opt, torch.optim.AdamW)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0 and decayed["betas"] == (0.9, 0.99)
    assert {p.dim() for p in decayed["params"]} == {2} and {p.dim() for p in plain["params"]} == {1}
    assert any(p is model.embed.weight for p in decayed["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))
    adam = make_optimizer(model, "adam", 0.0, [0.9, 0.98])
    assert type(adam) is torch.optim.Adam and adam.param_groups[0]["eps"] == 1e-9  # the paper's


def test_a_language_models_pad_id_inside_its_text_is_trained_and_scored():
    """An imported model's pad_id can be a real token of its text (GPT-2's): every label of a
    window is trained on and validated, whatever the model's pad_id, and only validation's
    overlap (NOT_SCORED) is left out."""

    from transformer.model.config import ModelConfig
    from transformer.data.text import NOT_SCORED, windows
    from transformer.model import LanguageModel
    from transformer.train.update import train_step
    from transformer.train.task import scored_nll

    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", kind="decoder-only", vocab_size=11, max_len=16, pad_id=3, bos_id=1, eos_id=2)
    model = LanguageModel(cfg).eval()  # (no dropout: the step's loss is compared below)
    stream = torch.tensor([3, 4, 3, 5, 6, 3, 7, 8, 3, 9, 10, 3] * 3)
    batch = windows(stream, torch.tensor([0, 5]), 8)
    assert (batch.y == 3).any() and batch.n_tgt_tokens == batch.y.numel()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = train_step(model, [batch], opt, 0.0, epsilon=0.0).read()
    with torch.no_grad():
        logp = model(batch.x, padded=False).log_softmax(-1)  # a window holds no padding
    expected = -logp.gather(-1, batch.y[..., None]).mean()
    assert stats.n_tokens == batch.y.numel() and stats.nll == pytest.approx(float(expected), rel=1e-5)
    batch.y[0, :3] = NOT_SCORED  # validation: scored by the window before
    assert torch.equal(batch.x, windows(stream, torch.tensor([0, 5]), 8).x)  # the inputs are untouched
    nll, k = scored_nll(model, (batch.x,), batch.y, NOT_SCORED, torch.device("cpu"), None, batch.options)
    keep = batch.y != NOT_SCORED
    assert k == int(keep.sum()) and nll == pytest.approx(float(-logp.gather(-1, batch.y.clamp(min=0)[..., None])[..., 0][keep].sum()), rel=1e-5)
