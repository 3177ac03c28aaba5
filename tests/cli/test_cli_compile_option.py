"""``--compile`` on ``attention`` and ``explain``: it chooses how their translation is
searched for (the same translation either way), and TRANSFORMER_COMPILE=off still wins.
(A stand-in build that fails shows the option reaching the search without a real build.)"""
from __future__ import annotations

import pytest

from transformer.compiled import build as aot

FAILED = ["compiling the decoding step (a minute or a few, once: it is kept in your cache)",
          "warning: cannot build the compiled decoding step (RuntimeError: no C++ compiler found); decoding eagerly"]


@pytest.fixture
def no_compiler(monkeypatch):
    def build(*args):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(aot, "build", build)


@pytest.mark.parametrize("command", [["explain"], ["attention", "--focus", "dog", "--to", "dog"]])
def test_compile_chooses_how_the_translation_is_searched_for(command, trained, cli, no_compiler, monkeypatch,
                                                             one_line_error):
    argv = [command[0], "red dog runs", "--model", trained.run, *command[1:]]
    eager = cli(*argv, "--compile", "off")
    assert eager.code == 0 and eager.err == "", eager.err
    on = cli(*argv, "--compile", "on")
    assert (on.code, on.out) == (0, eager.out) and on.err.splitlines() == FAILED
    # --target: nothing is searched for, so --compile is refused rather than ignored
    one_line_error(cli(*argv, "--compile", "on", "--target", "rot hund"), command[0], "--compile", "--target")
    assert cli(*argv, "--target", "rot hund").err == ""
    monkeypatch.setenv("TRANSFORMER_COMPILE", "off")
    assert cli(*argv, "--compile", "on").err == ""


def test_a_bad_compile_value_is_a_one_line_error(trained, cli, one_line_error):
    one_line_error(cli("explain", "red dog", "--model", trained.run, "--compile", "sometimes"), "explain",
                   "compile must be one of auto, on, off")
