"""`--shortlist`: built once from the run's training corpus into its folder, then read; decoding
produces only the batch's shortlisted tokens; a bad file, a link, a run without a corpus, an
ensemble and a language model are refused in one line (exit 2)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from transformer.decode.decoding_config import DecodingConfig
from transformer.decode.shortlist import load_shortlist
from transformer.errors import UserError
from transformer.inference.generator import Generator
from transformer.inference.translator import load_translator
from transformer.model import LanguageModel
from transformer.model.config import ModelConfig

LINES = ["red dog runs", "the big cat sits under the tree", "a woman plays with a ball near the house",
         "small bird", "the man sees a green car"]
TEXT = "".join(line + "\n" for line in LINES)


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run (the shortlist is written into it)."""
    return shutil.copytree(trained.run, tmp_path / "run")


@pytest.mark.parametrize("beam", ["1", "4"])
def test_built_once_then_read_and_only_its_tokens_are_produced(run, cli, beam):
    first = cli("translate", "--model", run, "--shortlist", "--beam", beam, stdin=TEXT)
    assert first.code == 0, first.err
    assert "built the vocabulary shortlist" in first.err and str(run / "shortlist.safetensors") in first.err
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no temporary file left
    again = cli("translate", "--model", run, "--shortlist", "--beam", beam, stdin=TEXT)
    assert again.code == 0 and "built" not in again.err and again.out == first.out

    translator = load_translator(run, beam=int(beam), shortlist=True)
    cfg = translator.model.cfg
    shortlist = load_shortlist(run / "shortlist.safetensors", cfg.vocab_size, cfg.target_vocab_size)
    for line, out in zip(LINES, first.out.splitlines()):
        src = torch.tensor([translator.encode(line)])
        allowed = set(shortlist.for_batch(src).tolist())
        ids = translator.translate_nbest([line], 1)[0][0].tokens
        assert ids and set(ids) <= allowed
        assert translator.subwords.decode(ids) == out  # (alone or in the batch: padding changes nothing)


def test_off_by_default_writes_nothing(run, cli):
    r = cli("translate", "--model", run, stdin=TEXT)
    off = cli("translate", "--model", run, "--no-shortlist", stdin=TEXT)
    assert r.code == 0 and off.code == 0 and off.out == r.out
    assert not (run / "shortlist.safetensors").exists()


def test_a_corrupt_file_is_refused(run, cli, one_line_error):
    (run / "shortlist.safetensors").write_bytes(b"\x00" * 40)
    r = cli("translate", "--model", run, "--shortlist", stdin=TEXT)
    one_line_error(r, "translate", run / "shortlist.safetensors", "corrupt")


def test_a_link_out_of_the_run_is_refused(run, cli, one_line_error, tmp_path):
    good = cli("translate", "--model", run, "--shortlist", stdin=TEXT)
    assert good.code == 0
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(run / "shortlist.safetensors", outside)
    (run / "shortlist.safetensors").symlink_to(outside)
    r = cli("translate", "--model", run, "--shortlist", stdin=TEXT)
    one_line_error(r, "translate", run / "shortlist.safetensors", "symbolic link")


def test_a_run_without_its_corpus_is_refused_naming_the_option(run, cli, one_line_error):
    (run / "import.json").write_text(json.dumps({"source": "elsewhere"}))  # as an imported model's run
    r = cli("translate", "--model", run, "--shortlist", stdin=TEXT)
    one_line_error(r, "translate", "--shortlist-from SRC TGT", "corpus")
    assert not (run / "shortlist.safetensors").exists()


def test_a_parallel_text_given_builds_it(run, trained, cli, one_line_error):
    (run / "import.json").write_text(json.dumps({"source": "elsewhere"}))  # no corpus of its own
    src, tgt = trained.corpus["train_src"], trained.corpus["train_tgt"]
    r = cli("translate", "--model", run, "--shortlist-from", src, tgt, stdin=TEXT)
    assert r.code == 0 and "from 400 given pairs" in r.err, r.err
    again = cli("translate", "--model", run, "--shortlist", stdin=TEXT)  # read back, the same translations
    assert again.code == 0 and again.out == r.out and "built" not in again.err
    bad = cli("translate", "--model", run, "--shortlist-from", src, trained.corpus["valid_tgt"], stdin=TEXT)
    one_line_error(bad, "translate", "differ in length")
    off = cli("translate", "--model", run, "--no-shortlist", "--shortlist-from", src, tgt, stdin=TEXT)
    one_line_error(off, "translate", "--no-shortlist")


def test_an_ensemble_is_refused(run, cli, one_line_error):
    steps = sorted((run / "checkpoints").iterdir())
    r = cli("translate", "--model", *steps[-2:], "--shortlist", stdin=TEXT)
    one_line_error(r, "translate", "--shortlist", "ensemble")


def test_a_language_model_is_refused():
    model = LanguageModel(ModelConfig.preset("toy", kind="decoder-only", vocab_size=20, max_len=16)).eval()
    with pytest.raises(UserError, match="language model; shortlist is for translation"):
        Generator(model, tokenizer=None, decoding=DecodingConfig(shortlist=True))


def test_a_bad_value_in_the_run_config_is_one_line(run, cli, one_line_error):
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("decoding: {}", "decoding:\n  shortlist: maybe"))
    r = cli("translate", "--model", run, stdin=TEXT)
    one_line_error(r, "translate", "shortlist must be true or false")
