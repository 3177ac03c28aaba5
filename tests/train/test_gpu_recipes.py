"""The GPU recipes: the paper's base model at the paper's batch (configs/wmt14-en-de-base.yaml)
and nanoGPT's GPU Shakespeare recipe (configs/shakespeare-char-gpu.yaml) say what they say,
and each, shrunk by overrides to a toy model on a toy corpus, trains a few updates on the CPU
through the same Trainer a GPU run uses."""
from __future__ import annotations

import random
from pathlib import Path

from own_data import file_overrides
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TINY_RUN = ["max_steps=3", "log_every=2", "eval_every=1000", "save_every=1000", "progress=false", "threads=1"]


def test_the_base_recipe_is_the_papers_model_and_batch():
    cfg = load_config(CONFIGS / "wmt14-en-de-base.yaml")
    model = cfg.model_config(vocab_size=cfg.vocab_size)
    assert (model.n_layers, model.d_model, model.d_ff, model.n_heads, model.dropout) == (6, 512, 2048, 8, 0.1)
    assert cfg.vocab_size == 37000 and (cfg.lr_schedule, cfg.warmup, cfg.max_steps) == ("noam", 4000, 100000)
    # 8 ranks x accum_steps x max_tokens: about the paper's 25,000 tokens a side, an update
    assert 25000 <= 8 * cfg.accum_steps * cfg.max_tokens <= 30000
    text = (CONFIGS / "wmt14-en-de-base.yaml").read_text(encoding="utf-8")
    assert "--set accum_steps=8" in text and "--set max_tokens=28000" in text  # the one-GPU forms of that batch


def test_the_gpu_language_model_recipe_is_nanogpts():
    cfg = load_config(CONFIGS / "shakespeare-char-gpu.yaml")
    model = cfg.model_config(vocab_size=65)
    assert (model.n_layers, model.n_heads, model.d_model, model.max_len, model.dropout) == (6, 6, 384, 256, 0.2)
    assert (cfg.batch_size, cfg.max_steps, cfg.lr_decay_steps, cfg.warmup) == (64, 5000, 5000, 100)
    assert (cfg.peak_lr, cfg.min_lr, cfg.betas, cfg.weight_decay, cfg.clip_norm) == (1e-3, 1e-4, [0.9, 0.99], 0.1, 1.0)
    assert (cfg.optimizer, cfg.lr_schedule, cfg.dataset, cfg.tokenizer) == ("adamw", "cosine", "tinyshakespeare", "chars")
    assert not model.bias and cfg.log_every == 10


def test_a_shrunk_base_recipe_trains_on_the_cpu(corpus, tmp_path):
    toy = file_overrides(corpus)  # the toy corpus, model and batch in place of WMT14's
    cfg = load_config(CONFIGS / "wmt14-en-de-base.yaml", [*toy, "accum_steps=2", "warmup=2", *TINY_RUN])
    result = Trainer(cfg, tmp_path / "run", log=lambda *a: None).train()
    assert result["step"] == 3 and result["reason"] == "max_steps"


def test_a_shrunk_gpu_language_model_recipe_trains_on_the_cpu(tmp_path):
    rng = random.Random(0)
    text = "".join(" ".join(rng.choice("to be or not that is the question".split()) for _ in range(8)) + "\n"
                   for _ in range(300))
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    small = ["dataset=text", f"text_files=[{tmp_path / 'text.txt'}]", "model.d_model=32", "model.n_heads=2",
             "model.d_ff=64", "model.n_layers=1", "model.max_len=16", "batch_size=4", "precision=fp32"]
    cfg = load_config(CONFIGS / "shakespeare-char-gpu.yaml", [*small, *TINY_RUN])
    result = Trainer(cfg, tmp_path / "run", log=lambda *a: None).train()
    assert result["step"] == 3 and result["reason"] == "max_steps"
