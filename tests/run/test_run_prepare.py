"""Data preparation for a run (dataset: files): empty / whitespace-only pairs are skipped
and counted, pairs too long for the model are filtered and counted, both are reported,
and the remaining pairs stay aligned."""
from __future__ import annotations

from pathlib import Path

import pytest

from transformer.errors import UserError
from transformer.train.prepare import prepare_data
from transformer.train.trainer import Trainer

EMPTY = [("", "xder"), ("   ", "xgod"), ("red dog", " \t "), ("", "")]
LONG = [(" ".join(["dog"] * 200), "xgod"), ("red cat", " ".join(["xtac"] * 200))]


@pytest.fixture
def dirty(tmp_path, corpus) -> dict[str, Path]:
    """The synthetic corpus with empty and overlong pairs mixed into train and valid."""
    src = corpus["train_src"].read_text().splitlines()
    tgt = corpus["train_tgt"].read_text().splitlines()
    clean = list(zip(src, tgt))
    pairs = clean[:50] + EMPTY[:2] + clean[50:100] + LONG + EMPTY[2:] + clean[100:]
    vsrc = corpus["valid_src"].read_text().splitlines()
    vtgt = corpus["valid_tgt"].read_text().splitlines()
    valid = [("", "xnam")] + list(zip(vsrc, vtgt)) + [("a man", "   ")]
    out = {}
    for name, rows in (("train", pairs), ("valid", valid)):
        for side, k in (("src", 0), ("tgt", 1)):
            path = tmp_path / f"{name}.{side}"
            path.write_text("".join(r[k] + "\n" for r in rows), encoding="utf-8")
            out[f"{name}_{side}"] = path
    out["clean"] = clean
    out["valid_clean"] = list(zip(vsrc, vtgt))
    return out


def _files(d: dict) -> list[str]:
    return [f"{k}={d[k]}" for k in ("train_src", "train_tgt", "valid_src", "valid_tgt")]


def test_empty_and_long_pairs_are_skipped_and_counted(dirty, make_cfg, tmp_path, log):
    cfg = make_cfg(*_files(dirty))
    data = prepare_data(cfg, tmp_path / "run", max_len=128, log=log)
    assert data.n_empty == len(EMPTY)
    assert data.n_too_long == len(LONG)
    assert "skipped 4 empty, 2 longer than 128" in log.text()
    # What is left is exactly the clean corpus, in order and aligned.
    decoded = [(data.subwords.decode(s), data.subwords.decode(t)) for s, t in data.train]
    assert decoded == dirty["clean"]
    assert data.valid == dirty["valid_clean"]


def test_trainer_reports_the_counts(dirty, make_cfg, tmp_path, log):
    trainer = Trainer(make_cfg(*_files(dirty), "max_steps=1"), tmp_path / "run", log=log)
    assert (trainer.data.n_empty, trainer.data.n_too_long) == (4, 2)
    assert len(trainer.data.train) == len(dirty["clean"])
    line = next(x for x in log if x.startswith("training pairs:"))
    assert f"training pairs: {len(dirty['clean'])}" in line and "4 empty" in line and "2 longer than" in line


def test_train_limit_counts_kept_pairs(dirty, make_cfg, tmp_path):
    data = prepare_data(make_cfg(*_files(dirty), "train_limit=60"), tmp_path / "run", max_len=128, log=lambda *a: None)
    assert len(data.train) == 60  # the 2 empty pairs among the first 62 lines do not eat into the limit


def test_misaligned_files_are_refused(dirty, make_cfg, tmp_path):
    short = tmp_path / "short.tgt"
    short.write_text("".join(dirty["train_tgt"].read_text().splitlines(keepends=True)[:-3]), encoding="utf-8")
    with pytest.raises(UserError) as e:
        prepare_data(make_cfg(*_files(dirty), f"train_tgt={short}"), tmp_path / "run", 128, log=lambda *a: None)
    assert str(dirty["train_src"]) in str(e.value) and str(short) in str(e.value)


def test_only_empty_pairs_is_a_user_error(make_cfg, tmp_path):
    for side in ("src", "tgt"):
        (tmp_path / f"e.{side}").write_text("\n \n\t\n", encoding="utf-8")
    with pytest.raises(UserError, match="no training pairs"):
        prepare_data(make_cfg(f"train_src={tmp_path / 'e.src'}", f"train_tgt={tmp_path / 'e.tgt'}"),
                     tmp_path / "run", 128, log=lambda *a: None)


def test_lowercase_run_learns_lowercase_subwords(corpus, make_cfg, tmp_path, log):
    """``lowercase: true``: the subword model lower-cases everything, validation BLEU compares
    with lower-cased references, and reusing the run directory with the other setting is refused."""
    files = {}
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        lines = corpus[key].read_text().splitlines()
        files[key] = tmp_path / f"cased.{key}"
        files[key].write_text("".join(line.title() + "\n" for line in lines), encoding="utf-8")
    cfg = make_cfg(*_files(files), "lowercase=true")
    data = prepare_data(cfg, tmp_path / "run", log=log)
    assert data.subwords.lowercases
    assert "lower-casing" in log.text()
    train = list(zip(files["train_src"].read_text().splitlines(), files["train_tgt"].read_text().splitlines()))
    assert any(s != s.lower() for s, _ in train)  # the input really is cased
    assert [(data.subwords.decode(s), data.subwords.decode(t)) for s, t in data.train] == \
        [(s.lower(), t.lower()) for s, t in train]
    valid_src = files["valid_src"].read_text().splitlines()
    assert [s for s, _ in data.valid] == valid_src  # the model lower-cases the source itself
    assert [t for _, t in data.valid] == [t.lower() for t in files["valid_tgt"].read_text().splitlines()]

    with pytest.raises(UserError, match=r"subwords.model: this subword model lower-cases.*lowercase: false"):
        prepare_data(make_cfg(*_files(files)), tmp_path / "run", log=log)
    cased = prepare_data(make_cfg(*_files(files)), tmp_path / "cased-run", log=log)
    assert not cased.subwords.lowercases and cased.valid[0][1] != cased.valid[0][1].lower()
