"""Bad input to ``transformer export``: exit 2, one stderr line naming the problem, no
traceback, and no output directory (nor a temporary one) left behind."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest


def _no_leftovers(folder: Path, allowed: set[str]) -> None:
    assert {p.name for p in folder.iterdir()} == allowed, "a partial or temporary directory was left"


def test_missing_model_directory(cli, tmp_path, one_line_error):
    r = cli("export", "--model", tmp_path / "nothere", "--format", "marian", "--out", tmp_path / "out")
    one_line_error(r, "nothere")
    _no_leftovers(tmp_path, set())


def test_model_without_subwords(cli, trained, tmp_path, one_line_error):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.safetensors").write_bytes((trained.run / "best.safetensors").read_bytes())
    r = cli("export", "--model", tmp_path / "run", "--format", "ctranslate2", "--out", tmp_path / "out")
    one_line_error(r, "subwords.model")
    _no_leftovers(tmp_path, {"run"})


@pytest.mark.parametrize("fmt", ["tensorrt", "ONNX", ""])
def test_unknown_format(fmt, cli, trained, tmp_path, one_line_error):
    r = cli("export", "--model", trained.run, "--format", fmt, "--out", tmp_path / "out")
    one_line_error(r, "--format", "ctranslate2")
    _no_leftovers(tmp_path, set())


@pytest.mark.parametrize("fmt, quant, mention", [("marian", "int8", "ctranslate2 only"),
                                                  ("ctranslate2", "int4", "int4")])
def test_bad_quantization(fmt, quant, mention, cli, trained, tmp_path, one_line_error):
    r = cli("export", "--model", trained.run, "--format", fmt, "--quantization", quant, "--out", tmp_path / "out")
    one_line_error(r, "--quantization", mention)
    _no_leftovers(tmp_path, set())


@pytest.mark.parametrize("fmt", ["ctranslate2", "marian", "onnx"])
def test_unwritable_out(fmt, cli, trained, tmp_path, one_line_error):
    """Under a regular file (root may write anywhere else)."""
    (tmp_path / "afile").write_text("x")
    r = cli("export", "--model", trained.run, "--format", fmt, "--out", tmp_path / "afile" / "out")
    one_line_error(r, "afile")
    _no_leftovers(tmp_path, {"afile"})
    assert (tmp_path / "afile").read_text() == "x"


def test_out_already_exists(cli, trained, tmp_path, one_line_error):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    r = cli("export", "--model", trained.run, "--format", "marian", "--out", tmp_path / "out")
    one_line_error(r, "out", "already exists")
    _no_leftovers(tmp_path / "out", {"keep.txt"})
    _no_leftovers(tmp_path, {"out"})


def test_empty_out_directory_is_filled(cli, trained, tmp_path):
    (tmp_path / "out").mkdir()
    r = cli("export", "--model", trained.run, "--format", "marian", "--out", tmp_path / "out")
    assert r.code == 0, r.err
    assert (tmp_path / "out" / "config.json").is_file()
    _no_leftovers(tmp_path, {"out"})


def test_failure_during_export_leaves_nothing(cli, trained, tmp_path, monkeypatch, one_line_error):
    """A format that cannot express the model fails after the temporary directory exists."""
    from transformer.interop import marian

    def refuse(model, out_dir, *args, **kwargs):
        (Path(out_dir) / "half-written.bin").write_bytes(b"x")
        raise ValueError("HF Marian is post-norm: needs norm_first=False")

    monkeypatch.setattr(marian, "save_marian", refuse)
    r = cli("export", "--model", trained.run, "--format", "marian", "--out", tmp_path / "out")
    one_line_error(r, "--format marian", "post-norm")
    _no_leftovers(tmp_path, set())


def test_help(cli):
    r = cli("export", "--help")
    assert r.code == 0 and "--quantization" in r.out and "ctranslate2" in r.out
    assert 'pipeline("translation"' in r.out and "--format marian" in r.out


@pytest.mark.parametrize("fmt, module", [("ctranslate2", "ctranslate2"), ("marian", "transformers"),
                                         ("onnx", "onnxruntime"), ("onnx", "onnxscript")])
def test_missing_export_extra(fmt, module, cli, trained, tmp_path, monkeypatch, one_line_error):
    """Each format names the package it lacks and the extra that brings it; nothing written."""
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if not installed
    r = cli("export", "--model", trained.run, "--format", fmt, "--out", tmp_path / "out")
    one_line_error(r, f"--format {fmt}", module, "pip install '.[export]'")
    _no_leftovers(tmp_path, set())
