"""A tiny untrained run directory (weights + subword model) built in a second, for the
attention pictures and the walkthrough. The weights are random: these tests check what is
drawn and computed, not what a trained model attends to."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.data.subwords import train_subwords
from transformer.run import save_weights

TEXTS = [
    "The animal didn't cross the street because it was too tired.",
    "A dog runs in the park with a ball.",
    "Ein Hund läuft über die Straße, weil er müde ist.",
    "Große Männer grüßen schöne Frauen.",
    "Žluťoučký kůň úpěl ďábelské ódy.",
    "Příliš řeč často přišla včera.",
    "Two children are playing near the water.",
    "Zwei Kinder spielen in der Nähe des Wassers.",
    "Das Tier überquerte die Straße nicht, weil es zu müde war.",
    "你好，世界",
]


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """RUN_DIR/best.safetensors + RUN_DIR/subwords.model: 2+2 layers, 2 heads, d_model 16."""
    root = tmp_path_factory.mktemp("viz-run")
    subwords = train_subwords(TEXTS * 3, root / "subwords", vocab_size=120)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=subwords.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                      dropout=0.0, max_len=64)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm parameters
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    save_weights(model, root / "best.safetensors")
    return root


