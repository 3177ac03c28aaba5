"""``transformer explain --training``: one update in the article's formulas. The printed loss is
the cross-entropy of the run's own first batch, the printed Adam entries are what
torch.optim.AdamW does, the loss falls for a small learning rate, and the run's files are
never touched."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from transformer.data.chars import Chars
from transformer.data.text import WindowSampler, read_texts, split_text, windows
from transformer.run import load_model
from transformer.viz.walkthrough_training import explain_update


def run_config(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))


def first_batch(run: Path):
    """The run's first training batch, rebuilt from its text, its chars.json and its seed."""
    cfg = run_config(run)
    chars = Chars.load(run / "chars.json")
    train_text, _ = split_text(read_texts(cfg["text_files"]), cfg["valid_fraction"])
    stream = torch.tensor(chars.encode(train_text))
    context = cfg["context"] or cfg["model"]["max_len"]
    starts = WindowSampler(len(stream), context, cfg["batch_size"], cfg["seed"]).next_starts()
    return windows(stream, starts, context)


def cross_entropy(model, batch) -> torch.Tensor:
    logits = model(batch.x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.y.reshape(-1))


def digests(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def update(trained_lm):
    before = digests(trained_lm)
    u = explain_update(trained_lm)
    assert digests(trained_lm) == before  # nothing written, nothing touched
    return u.numbers


def test_the_loss_is_the_cross_entropy_of_the_runs_first_batch(trained_lm, update):
    model, _ = load_model(trained_lm)
    batch = first_batch(trained_lm)
    with torch.no_grad():
        assert update["loss"] == pytest.approx(float(cross_entropy(model, batch)), rel=1e-6)
        row, t = update["row"], update["position"]
        logp = model(batch.x).log_softmax(-1)[row, t, batch.y[row, t]]
    assert update["minus_log_p"] == pytest.approx(-float(logp), rel=1e-5)
    assert update["p"] == pytest.approx(float(logp.exp()), rel=1e-5)
    assert update["batch_shape"] == list(batch.y.shape) and update["scored_tokens"] == batch.y.numel()
    assert Chars.load(trained_lm / "chars.json").decode([int(batch.y[row, t])]) in (update["token"], " ", "\n")


def test_the_adam_step_is_torchs_adamw(trained_lm, update):
    """The same update made independently: plain loss, backward, the run's clipping, and a
    non-fused torch.optim.AdamW with nanoGPT's groups at the printed learning rate."""
    cfg = run_config(trained_lm)
    model, _ = load_model(trained_lm)
    params = dict(model.named_parameters())
    cross_entropy(model, first_batch(trained_lm)).backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["clip_norm"])
    w = params[update["parameter"]]
    old, grad = w.detach().clone(), w.grad.clone()
    decay = [p for p in params.values() if p.dim() >= 2]
    rest = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=update["lr"], betas=tuple(cfg["betas"]))
    opt.step()
    assert update["parameter"] == "decoder.layers.0.self_attn.q_proj.weight"  # layer 1's WQ
    for e in update["entries"]:
        i = tuple(e["index"])
        assert e["w_old"] == pytest.approx(float(old[i]), abs=1e-9)
        assert e["grad"] == pytest.approx(float(grad[i]), rel=1e-4, abs=1e-9)
        assert e["adam_new"] == pytest.approx(float(w.detach()[i]), abs=1e-7)
        assert e["adam_formula"] == pytest.approx(float(w.detach()[i]), abs=1e-7)
        assert e["sgd_new"] == pytest.approx(float(old[i] - update["lr"] * grad[i]), abs=1e-9)
        # the first Adam step moves an entry by about lr whatever its gradient, SGD by lr x gradient
        assert abs(e["adam_move_over_lr"]) == pytest.approx(1.0, abs=0.02)
    assert update["adam_mean_move_over_lr"] == pytest.approx(1.0, abs=0.02)


def test_the_loss_falls_for_a_small_lr(trained_lm):
    n = explain_update(trained_lm, lr=1e-4).numbers
    assert n["lr"] == 1e-4
    assert n["loss_after"] < n["loss"]
    assert n["loss_after_sgd"] < n["loss"]


def test_deterministic_and_from_init_starts_near_ln_v(trained_lm, update):
    assert explain_update(trained_lm).numbers == update
    n = explain_update(trained_lm, matrix="layer 1 W_up", from_init=True).numbers
    assert n["parameter"] == "decoder.layers.0.ffn.fc1.weight" and n["weights_step"] == 0
    assert n["loss"] == pytest.approx(n["ln_V"], abs=0.1)  # a random model guesses about uniformly
    assert n["loss"] > update["loss"]


def test_the_llama_run_follows_its_gate(trained_llama):
    n = explain_update(trained_llama, matrix="layer 2 W_gate").numbers
    assert n["parameter"] == "decoder.layers.1.ffn.gate.weight" and n["shape"] == [64, 32]
    assert n["optimizer"] == "adamw" and n["loss_after"] < n["loss"]


def test_the_command_prints_the_formulas(cli, trained_lm):
    r = cli("explain", "--model", trained_lm, "--training")
    assert r.code == 0, r.err
    for text in ("Loss = -log p", "dLoss/dW", "W_new = W_old - lr", "SGD", "Adam", "after Adam's step",
                 "the run's files are not changed"):
        assert text in r.out
    r = cli("explain", "--model", trained_lm, "--training", "--json", "--matrix", "we")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["matrix"] == "We" and data["parameter"] == "embed.weight"


def test_a_translation_run_is_explained_too(tmp_path, log):
    """A translation run: the batch is its first token-bucketed batch of sentence pairs."""
    from transformer.train.train_config import load_config
    from transformer.train.trainer import Trainer
    from tiny_corpus import write_corpus

    corpus = write_corpus(tmp_path / "corpus", n_train=60, n_valid=4)
    cfg = load_config(None, ["dataset=files", f"train_src={corpus['train_src']}", f"train_tgt={corpus['train_tgt']}",
                             "vocab_size=60", "eval_bleu=false", "model.preset=toy", "model.d_model=16",
                             "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "max_tokens=200",
                             "max_steps=3", "eval_every=1000", "save_every=3", "precision=fp32", "progress=false",
                             "warmup=2", "peak_lr=0.01", "lr_schedule=inverse_sqrt"])
    Trainer(cfg, tmp_path / "run", log=log).train()
    before = digests(tmp_path / "run")
    n = explain_update(tmp_path / "run", lr=1e-3).numbers
    assert digests(tmp_path / "run") == before
    assert n["matrix"] == "encoder layer 1 WQ" and n["parameter"] == "encoder.layers.0.self_attn.q_proj.weight"
    assert n["optimizer"] == "adam"
    assert " => " in n["context"] and n["loss_after"] < n["loss"]


# ---- bad input ------------------------------------------------------------------------------

def copied_run(trained_lm: Path, tmp_path: Path, **config) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained_lm, run)
    cfg = {**run_config(run), **config}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return run


def test_missing_training_text_is_a_one_line_error(cli, one_line_error, trained_lm, tmp_path):
    run = copied_run(trained_lm, tmp_path, text_files=[str(tmp_path / "gone.txt")])
    one_line_error(cli("explain", "--model", run, "--training"), "explain", "--training needs the run's training data",
                   "gone.txt", "not found")


def test_missing_dataset_is_not_downloaded(cli, one_line_error, trained_lm, tmp_path, monkeypatch):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("TRANSFORMER_DATA", str(empty))
    run = copied_run(trained_lm, tmp_path, dataset="tinyshakespeare", text_files=[])
    one_line_error(cli("explain", "--model", run, "--training"), "explain", "training data", "downloading is off")
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("argv, mentions", [
    (["--matrix", "layer 9 WQ"], ["--matrix", "layer 9 WQ", "layer 1 WQ"]),
    (["--lr", "0"], ["--lr"]),
    (["--lr", "nan"], ["--lr"]),
    (["the cat"], ["no sentence"]),
    (["--step", "2"], ["--step"]),
])
def test_bad_training_options(cli, one_line_error, trained_lm, argv, mentions):
    one_line_error(cli("explain", "--model", trained_lm, "--training", *argv), "explain", *mentions)


def test_weights_without_a_run_directory(cli, one_line_error, trained_lm, tmp_path):
    shutil.copy(trained_lm / "best.safetensors", tmp_path / "w.safetensors")
    one_line_error(cli("explain", "--model", tmp_path / "w.safetensors", "--training"), "explain", "config.yaml")
