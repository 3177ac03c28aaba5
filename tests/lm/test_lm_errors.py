"""Bad input to a language-model run: one line on stderr, naming the file or option, exit 2."""
from __future__ import annotations

import pytest

from lm_text import make_text


def train(cli, config_file, tmp_path, *overrides, text=None):
    cfg = config_file(*overrides, text=text)
    return cli("train", "--config", cfg, "--out", tmp_path / "run")


def test_a_missing_file(cli, config_file, tmp_path, one_line_error):
    r = train(cli, config_file, tmp_path, text=tmp_path / "nowhere.txt")
    one_line_error(r, "train", "nowhere.txt", "not found")


@pytest.mark.parametrize("given", ["{a},{b}", "{a} {b}"])
def test_two_files_written_as_one_say_how_to_list_them(cli, config_file, tmp_path, one_line_error, text_file, given):
    """text_files=a.txt,b.txt (--set as a shell list, or a comma-separated YAML value) said
    'a.txt,b.txt: file not found', nothing about the list it takes."""
    other = tmp_path / "more.txt"
    other.write_text(make_text(), encoding="utf-8")
    value = given.format(a=text_file, b=other)
    r = train(cli, config_file, tmp_path, f"text_files={value}", text=text_file)
    one_line_error(r, "train", f"text_files: {value}: file not found; several files are a list: "
                               f"text_files: [{text_file}, {other}]")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content", ["", "  \n\n"], ids=["empty", "blank"])
def test_an_empty_file(cli, config_file, tmp_path, one_line_error, content):
    (tmp_path / "empty.txt").write_text(content)
    r = train(cli, config_file, tmp_path, text=tmp_path / "empty.txt")
    one_line_error(r, "train", "empty.txt", "holds no text")


def test_invalid_utf8_names_file_and_line(cli, config_file, tmp_path, one_line_error):
    (tmp_path / "latin1.txt").write_bytes(make_text().encode() + "Grüße\n".encode("latin-1"))
    r = train(cli, config_file, tmp_path, text=tmp_path / "latin1.txt")
    one_line_error(r, "train", "latin1.txt:121:", "invalid UTF-8")


@pytest.mark.parametrize("chars, part", [(200, "validation part"), (30, "training part")])
def test_a_text_shorter_than_two_context_windows(cli, config_file, tmp_path, one_line_error, chars, part):
    (tmp_path / "short.txt").write_text(make_text()[:chars])
    r = train(cli, config_file, tmp_path, text=tmp_path / "short.txt")
    one_line_error(r, "train", "short.txt", part, "fewer than two context windows")
    # the validation part's size is valid_fraction's: the line says so (it said only "a longer text
    # or a shorter context")
    assert ("a larger valid_fraction (now 0.1), or valid_fraction: 0 for none" in r.err) == (part == "validation part")


def test_a_context_longer_than_the_positions(cli, config_file, tmp_path, one_line_error, text_file):
    r = train(cli, config_file, tmp_path, "context=17", text=text_file)
    one_line_error(r, "train", "context 17", "model.max_len 16")


@pytest.mark.parametrize("overrides, mentions", [
    (["model.preset=tiny"], ["decoder-only model.preset", "nanogpt-char"]),
    (["max_epochs=2"], ["max_epochs"]),
    (["tokenizer=words"], ["tokenizer"]),
    (["valid_fraction=1.0"], ["valid_fraction"]),
    (["optimizer=sgd"], ["optimizer"]),
    (["betas=[0.9]"], ["betas"]),
    (["text_files=[]"], ["text_files"]),
])
def test_bad_options(cli, config_file, tmp_path, one_line_error, text_file, overrides, mentions):
    one_line_error(train(cli, config_file, tmp_path, *overrides, text=text_file), "train", *mentions)


def test_a_translation_corpus_with_a_decoder_only_model(cli, tmp_path, one_line_error):
    (tmp_path / "mt.yaml").write_text("dataset: multi30k\nmodel: {preset: nanogpt-char}\n")
    r = cli("train", "--config", tmp_path / "mt.yaml", "--out", tmp_path / "run")
    one_line_error(r, "train", "translation corpus", "decoder-only")
