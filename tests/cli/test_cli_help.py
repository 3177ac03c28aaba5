"""What ``--help`` tells a newcomer: the defaults of serve's limits (the values the server
applies), that import needs the interop extra, where train's data folder is, and what the
``toy`` command (the synthetic task, once ``demo``) is."""
from __future__ import annotations

import dataclasses
import re

import pytest


def help_text(cli, *argv) -> str:
    r = cli(*argv, "--help")
    assert r.code == 0 and r.err == ""
    return " ".join(r.out.split())  # argparse wraps to the terminal's width


def test_serve_shows_the_defaults_of_its_limits(cli):
    from transformer.serve.serve_config import ServeConfig

    text = help_text(cli, "serve")
    defaults = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
    for option in ("max_batch", "max_wait_ms", "max_chars", "max_texts", "max_queue"):
        flag = "--" + option.replace("_", "-")
        shown = re.search(rf"{flag} [A-Z_]+ [^\[]*?\(default: ([^);]+)", text)  # its line, not the usage's
        assert shown and float(shown[1]) == defaults[option], (flag, shown)
    assert "(default: 8000;" in text
    assert f"summed, times the beam); a larger one is a 413 (translation; default: {defaults['max_work']})" in text
    assert f"(or of its last answer) is closed (default: {defaults['header_timeout']:g})" in text
    assert "pip install '.[serve]'" in text


def test_serve_defaults_are_what_the_server_gets(cli, monkeypatch):
    """The options' defaults are ServeConfig's (the help shows them; a server started without
    them uses them)."""
    from transformer.cli import build_parser
    from transformer.serve.serve_config import ServeConfig

    args = build_parser().parse_args(["serve", "--model", "m"])
    for field in ("max_batch", "max_wait_ms", "max_chars", "max_texts", "max_queue", "timeout", "header_timeout",
                  "docs"):
        assert getattr(args, field) == getattr(ServeConfig, field), field


def test_import_names_its_extra(cli):
    assert "Needs the interop extra (transformers, tokenizers, huggingface_hub): pip install '.[interop]'" \
        in help_text(cli, "import")


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_the_default_data_folder_is_named(cli, command):
    assert "(default: $TRANSFORMER_DATA, else ~/.cache/transformer/data" in help_text(cli, command)


def test_toy_says_what_it_is_and_is_not(cli):
    text = help_text(cli, "toy")
    assert text.startswith("usage: transformer toy [-h] [--task {copy,reverse}] [--steps STEPS] [--seed SEED]")
    assert "synthetic task: copy, or reverse" in text and "Not the Multi30k demo model (configs/demo.yaml" in text
    assert "(default: 800)" in text and "default: reverse" in text
