"""``dataset: multi30k-mono``: one language's side of Multi30k as a language model's text,
its own train / val splits for training and validation (not a fraction of one text)."""
from __future__ import annotations

import gzip

import pytest

from transformer.data.registry import load_multi30k_text
from transformer.errors import UserError
from transformer.train.train_config import load_config
from transformer.train.prepare import prepare_data

TRAIN = ["Ein Hund läuft durch den Schnee.", "Zwei Kinder spielen im Park.", "Eine Frau kocht."] * 20
VAL = ["Ein Mann fährt Fahrrad.", "Eine Katze schläft."] * 10


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data" / "multi30k"
    folder.mkdir(parents=True)
    for split, lines in (("train", TRAIN), ("val", VAL)):
        with gzip.open(folder / f"{split}.de.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return tmp_path / "data"


def overrides(data_dir) -> list[str]:
    return ["dataset=multi30k-mono", "tgt_lang=de", f"data_dir={data_dir}", "tokenizer=chars",
            "model.preset=nanogpt-char", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
            "model.n_layers=1", "model.max_len=16", "batch_size=4", "progress=false"]


def test_one_side_is_read_as_a_text_a_sentence_a_line(data_dir):
    assert load_multi30k_text("train", "de", data_dir, download=False) == "".join(s + "\n" for s in TRAIN)


def test_training_and_validation_are_multi30ks_own_splits(data_dir, tmp_path):
    cfg = load_config(None, overrides(data_dir))
    assert cfg.is_language_model
    prepared = prepare_data(cfg, tmp_path / "run", max_len=16, log=lambda *a: None)
    decode = prepared.tokenizer.decode
    assert decode(prepared.train.tolist()) == "".join(s + "\n" for s in TRAIN)
    assert decode(prepared.valid.tolist()) == "".join(s + "\n" for s in VAL)


def test_a_missing_language_file_names_it(data_dir, tmp_path):
    cfg = load_config(None, overrides(data_dir) + ["tgt_lang=fr"])
    with pytest.raises(UserError, match=r"train\.fr\.gz"):
        load_multi30k_text("train", cfg.tgt_lang, data_dir, download=False)


def test_it_needs_a_decoder_only_model(data_dir):
    with pytest.raises(UserError, match="decoder-only"):
        load_config(None, overrides(data_dir) + ["model.preset=tiny"])
