"""Training's validation BLEU translates as ``transformer translate --beam 1 --precision fp32``
does, without the front door (train/ imports no inference/): the same greedy translations,
batches and cut of over-long lines, from a model in training mode."""
from __future__ import annotations

import random

import torch

from transformer import ModelConfig, Transformer
from transformer.decode.decoding_config import DecodingConfig
from transformer.inference.translator import Translator
from transformer.train.task import greedy_translations


class Letters:
    """A stand-in subword model: each character one id (3 .. 39), ids back to letters."""

    vocab_size = 40

    def encode(self, line: str) -> list[int]:
        return [3 + ord(c) % 37 for c in line]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def test_validation_translates_as_the_translate_command(recwarn):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=24,
                                    dropout=0.1))
    rng = random.Random(1)
    # 240 lines of up to 24 subwords (EOS included) fill more than one batch of 4,000; some are
    # longer than the model takes, some empty
    lines = ["".join(rng.choice("abcdefgh ") for _ in range(rng.randint(0, 30))) for _ in range(240)] + ["", "  "]
    model.train()
    want = Translator(model, Letters(), DecodingConfig(beam=1, device="cpu", precision="fp32")).translate(lines)
    cut = [w for w in recwarn.list if "longer than the model's limit" in str(w.message)]
    recwarn.clear()
    model.train()
    got = greedy_translations(model, Letters(), lines, torch.device("cpu"))
    assert got == want
    assert got[-2:] == ["", ""] and sum(map(bool, got)) > 200
    # decoded by an eval-mode copy (dropout off: the Translator's translations, from a model in
    # training mode), the caller's model left in the mode it was in
    assert model.training
    warned = [w for w in recwarn.list if "longer than the model's limit (23)" in str(w.message)]
    assert len(warned) == len(cut) > 0
    assert all(str(w.message).startswith("a validation line of ") for w in warned)


def test_validation_decodes_a_float32_copy_of_a_bf16_model():
    """A bf16 model is translated by a float32 copy of it (the scores that pick the best
    checkpoint are the same on every machine); the model itself keeps its dtype."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=24,
                                    dropout=0.0)).to(torch.bfloat16)
    lines = ["abc de", "fgh", "hgfedcba"]
    got = greedy_translations(model, Letters(), lines, torch.device("cpu"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert got == greedy_translations(model.float(), Letters(), lines, torch.device("cpu"))
