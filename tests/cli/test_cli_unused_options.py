"""An option the user typed that the command, as asked, does not use (a translation option on a
language model, ``--stride`` on translation, ``--beam`` with ``--target``, ``--layer`` without a
PNG, ``--output`` at an interactive prompt) is refused in one line naming it and what to do
(exit code 2, nothing written), never silently ignored; argparse's defaults never count."""
from __future__ import annotations

import io
import sys

import pytest

from transformer.cli import build_parser
from transformer.cli._options import SAMPLING_OPTIONS, SEARCH_OPTIONS


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny character language model (2 updates: its numbers do not matter here)."""
    from transformer.train.train_config import load_config
    from transformer.train.trainer import Trainer

    root = tmp_path_factory.mktemp("unused-lm")
    (root / "train.txt").write_text("the cat sat on the mat.\n" * 40, encoding="utf-8")
    cfg = load_config(None, [
        "dataset=text", f"text_files=[{root / 'train.txt'}]", "tokenizer=chars", "model.preset=nanogpt-char",
        "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "model.max_len=16",
        "batch_size=2", "warmup=1", "precision=fp32", "progress=false", "threads=1", "max_steps=2",
        "eval_every=2", "save_every=2"])
    Trainer(cfg, root / "run", log=lambda *a: None).train()
    return root / "run"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "text.txt").write_text("the cat sat.\n", encoding="utf-8")
    (tmp_path / "out").mkdir()
    return tmp_path


def refused(r, command: str, option: str, *mentions: str, one_line_error) -> None:
    one_line_error(r, command, f"{option} ", f"(remove {option})", *mentions)


# ---- evaluate ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [
    ["--beam", "2"], ["--alpha", "0.5"], ["--src", "{text}"], ["--ref", "{text}"], ["--split", "test_2016_flickr"],
    ["--output", "{out}/scores.txt"], ["--tgt-lang", "de"], ["--limit", "0"], ["--data-dir", "{out}"],
    ["--compile", "off"],
], ids=lambda extra: extra[0])
def test_evaluate_text_refuses_translation_options(extra, cli, lm_run, files, one_line_error):
    extra = [a.format(text=files / "text.txt", out=files / "out") for a in extra]
    r = cli("evaluate", "--model", lm_run, "--text", files / "text.txt", *extra)
    refused(r, "evaluate", extra[0], "--text scores a language model", one_line_error=one_line_error)
    assert list((files / "out").iterdir()) == []


def test_evaluate_text_names_every_refused_option(cli, lm_run, files, one_line_error):
    r = cli("evaluate", "--model", lm_run, "--text", files / "text.txt", "--beam", "2", "--alpha", "0.5")
    one_line_error(r, "evaluate", "--beam, --alpha are for translation; --text scores a language model "
                                  "(remove --beam, --alpha)")


def test_evaluate_translation_refuses_language_model_options(cli, trained, files, one_line_error):
    text = files / "text.txt"
    out = files / "out" / "hyps.txt"
    r = cli("evaluate", "--model", trained.run, "--src", text, "--ref", text, "--stride", "4", "--output", out)
    refused(r, "evaluate", "--stride", "--text", one_line_error=one_line_error)
    r = cli("evaluate", "--model", trained.run, "--src", text, "--ref", text, "--data-dir", files, "--output", out)
    refused(r, "evaluate", "--data-dir", "--split", one_line_error=one_line_error)
    assert not out.exists()


def test_evaluate_a_language_model_without_text(cli, lm_run, files, one_line_error):
    text = files / "text.txt"
    one_line_error(cli("evaluate", "--model", lm_run, "--src", text, "--ref", text, "--beam", "2"), "evaluate",
                   "a language model", "--text FILE")


# ---- explain -------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [["--beam", "2"], ["--compile", "off"], ["--target", "x"]],
                         ids=lambda extra: extra[0])
def test_explain_language_model_refuses_translation_options(extra, cli, lm_run, one_line_error):
    r = cli("explain", "the cat", "--model", lm_run, *extra)
    refused(r, "explain", extra[0], "is for a translation model", "a language model", one_line_error=one_line_error)


@pytest.mark.parametrize("extra", [["--temperature", "0.5"], ["--top-k", "0"], ["--top-p", "0.9"]],
                         ids=lambda extra: extra[0])
def test_explain_translation_refuses_sampling_options(extra, cli, trained, one_line_error):
    r = cli("explain", "red dog", "--model", trained.run, *extra)
    refused(r, "explain", extra[0], "is for a language model", "a translation model", one_line_error=one_line_error)


@pytest.mark.parametrize("extra", [["--beam", "2"], ["--compile", "off"]], ids=lambda extra: extra[0])
def test_explain_and_attention_with_target_refuse_search_options(extra, cli, trained, tmp_path, one_line_error):
    r = cli("explain", "red dog", "--model", trained.run, "--target", "rot hund", *extra)
    refused(r, "explain", extra[0], "--target gives the translation", one_line_error=one_line_error)
    r = cli("attention", "red dog", "--model", trained.run, "--target", "rot hund", "--out", tmp_path / "a.png", *extra)
    refused(r, "attention", extra[0], "--target gives the translation", one_line_error=one_line_error)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--beam", "2"], ["--device", "cpu"], ["--temperature", "0.5"], ["--step", "1"]],
                         ids=lambda extra: extra[0])
def test_explain_training_refuses_walk_options(extra, cli, trained, one_line_error):
    r = cli("explain", "--training", "--model", trained.run, *extra)
    refused(r, "explain", extra[0], "--training", one_line_error=one_line_error)


def test_explain_without_training_refuses_training_options(cli, trained, one_line_error):
    r = cli("explain", "red dog", "--model", trained.run, "--from-init")
    refused(r, "explain", "--from-init", "is for --training", one_line_error=one_line_error)


# ---- attention -----------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [["--beam", "2"], ["--compile", "off"], ["--target", "x"]],
                         ids=lambda extra: extra[0])
def test_attention_language_model_refuses_translation_options(extra, cli, lm_run, tmp_path, one_line_error):
    r = cli("attention", "the cat", "--model", lm_run, "--out", tmp_path / "a.png", *extra)
    refused(r, "attention", extra[0], "is for a translation model", one_line_error=one_line_error)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--layer", "1"], ["--head", "1"], ["--kind", "all"]], ids=lambda extra: extra[0])
def test_attention_picture_options_need_a_png(extra, cli, trained, tmp_path, one_line_error):
    r = cli("attention", "red dog", "--model", trained.run, "--focus", "dog", "--to", "dog", *extra)
    refused(r, "attention", extra[0], "without --out", one_line_error=one_line_error)
    r = cli("attention", "red dog", "--model", trained.run, "--out", tmp_path / "a.html", *extra)
    refused(r, "attention", extra[0], "HTML page", one_line_error=one_line_error)
    assert list(tmp_path.iterdir()) == []


# ---- translate -----------------------------------------------------------------------------

class Terminal(io.TextIOWrapper):
    """Typed lines on a terminal: text, with the bytes under it (``.buffer``) as a real stdin has."""

    def __init__(self, text: str) -> None:
        super().__init__(io.BytesIO(text.encode("utf-8")), encoding="utf-8")

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("extra", [["--output", "{out}/t.txt"], ["--n-best", "2"], ["--chunk-lines", "5"]],
                         ids=lambda extra: extra[0])
def test_translate_at_a_terminal_refuses_batch_options(extra, cli, trained, files, monkeypatch, one_line_error):
    monkeypatch.setattr(sys, "stdin", Terminal("red dog\n"))
    extra = [a.format(out=files / "out") for a in extra]
    r = cli("translate", "--model", trained.run, "--beam", "2", *extra)
    refused(r, "translate", extra[0], "typed at the terminal", one_line_error=one_line_error)
    assert list((files / "out").iterdir()) == []


def test_translate_at_a_terminal_without_them_translates(cli, trained, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Terminal("red dog\n"))
    r = cli("translate", "--model", trained.run, "--beam", "2")
    assert r.code == 0 and len(r.out.splitlines()) == 1, r.err


# ---- defaults ------------------------------------------------------------------------------

ONE_KIND = {*SEARCH_OPTIONS, *SAMPLING_OPTIONS, "compile", "src", "ref", "split", "data_dir", "tgt_lang", "limit",
            "output", "stride", "target", "matrix", "lr", "from_init", "step", "layer", "head", "kind", "n_best",
            "chunk_lines", "max_tokens", "max_beam", "max_work", "new_tokens_limit", "device"}


@pytest.mark.parametrize("argv", [
    ["evaluate", "--model", "m"], ["explain", "x", "--model", "m"], ["attention", "x", "--model", "m"],
    ["translate", "--model", "m"], ["generate", "--model", "m"], ["serve", "--model", "m"], ["info", "--model", "m"],
])
def test_options_left_out_are_never_taken_for_given(argv):
    """Every option the commands refuse for one model kind or mode defaults to None (a flag
    to False), so an option left out is never refused."""
    args = vars(build_parser().parse_args(argv))
    given = {name: args[name] for name in ONE_KIND & args.keys() if args[name] is not None and args[name] is not False}
    assert given == {}
