"""configs/lm-text.yaml, the README's two commands for a language model of your own text:
`train --config configs/lm-text.yaml --set "text_files=[...]"`, then `generate --prompt`.
Here the recipe is trained for 20 updates with a tiny model (the overrides below) on a text
written by the test; its own model, schedule and data keys are the recipe's."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from lm_text import make_text

from transformer.inference.generator import Generator
from transformer.train.train_config import load_config

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "lm-text.yaml"
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "model.max_len=32",
        "batch_size=4", "max_steps=20", "lr_decay_steps=20", "warmup=2", "eval_every=10", "save_every=10",
        "log_every=10", "precision=fp32", "threads=1", "progress=false"]


def test_the_recipe_is_a_llama_style_character_model_of_your_files():
    cfg = load_config(RECIPE)
    model = cfg.model_config(vocab_size=100)
    assert (cfg.dataset, cfg.tokenizer, cfg.init_from) == ("text", "chars", None)  # from scratch
    assert (model.kind, model.norm, model.positions, model.ffn_activation) == ("decoder-only", "rms", "rope", "swiglu")
    # the model and updates of configs/shakespeare-char-llama.yaml, whose training time it quotes
    ten = load_config(RECIPE.with_name("shakespeare-char-llama.yaml"))
    assert cfg.model_config(vocab_size=100) == ten.model_config(vocab_size=100)
    assert (cfg.max_steps, cfg.batch_size, cfg.peak_lr, cfg.max_minutes) == (ten.max_steps, ten.batch_size,
                                                                            ten.peak_lr, ten.max_minutes)


def test_the_larger_corpus_advice_builds():
    """The comment's changes for a larger corpus are keys that load and build a model."""
    cfg = load_config(RECIPE, ["tokenizer=bpe", "vocab_size=8000", "model.max_len=512", "model.d_model=512",
                               "model.n_heads=8", "model.d_ff=1408", "model.n_layers=8"])
    model = cfg.model_config(vocab_size=cfg.vocab_size)
    assert (model.max_len, model.d_model, model.vocab_size) == (512, 512, 8000)


def test_train_then_generate_with_the_two_commands(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # text_files are read from where the command starts, as in the README
    Path("my.txt").write_text(make_text(200, seed=3), encoding="utf-8")
    sets = [a for s in ["text_files=[my.txt]", *TINY] for a in ("--set", s)]
    r = cli("train", "--config", RECIPE, "--out", "runs/mine", *sets)
    assert r.code == 0, r.err
    run = tmp_path / "runs" / "mine"
    assert (run / "chars.json").is_file() and (run / "best.safetensors").is_file()
    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["decoding"] == {"temperature": 0.8, "top_k": 40, "max_new_tokens": 300}

    r = cli("generate", "--model", "runs/mine", "--prompt", "the cat", "--seed", "1")
    assert r.code == 0 and r.err == ""
    generator = Generator.from_pretrained(run, seed=1)  # the run's decoding settings, as generate's defaults
    d = generator.decoding
    assert (d.max_new_tokens, d.temperature, d.top_k) == (300, 0.8, 40)
    assert r.out == "the cat" + generator.generate(["the cat"])[0] + "\n"
    assert set(r.out) <= set(make_text(200, seed=3)) and len(r.out) > 100  # characters of the text only
    again = cli("generate", "--model", "runs/mine", "--prompt", "the cat", "--seed", "1")
    assert again.out == r.out  # the same seed, the same text


@pytest.mark.parametrize("length, ok", [(2_600, True), (2_000, False)])
def test_the_shortest_text_the_comment_names(tmp_path, cli, monkeypatch, length, ok):
    """About 2,600 characters: two context windows (2 x 128 + 1) in the last 10%."""
    monkeypatch.chdir(tmp_path)
    text = make_text(400, seed=1)[:length]
    Path("short.txt").write_text(text, encoding="utf-8")
    sets = [a for s in ["text_files=[short.txt]", "max_steps=2", "lr_decay_steps=2", "warmup=1", "model.n_layers=1",
                        "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "precision=fp32", "progress=false"]
            for a in ("--set", s)]
    r = cli("train", "--config", RECIPE, "--out", "runs/short", *sets)
    assert (r.code == 0) == ok, r.err
    if not ok:
        assert "valid_fraction" in r.err
