"""A missing optional package is one line naming the ``pip install '.[EXTRA]'``
that fixes it: from the helper, the commands (exit 2, no traceback) and the Python API.
Imports are made to fail with ``sys.modules[name] = None``, as if the package were absent."""
from __future__ import annotations

import importlib
import sys

import pytest
import yaml

from transformer.errors import UserError
from transformer.extras import MissingExtra, require
from tiny_corpus import write_corpus


def test_require_returns_the_module():
    import json

    assert require("json", "serve", "this test") is json


def test_missing_module_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingExtra) as e:
        require("fastapi", "serve", "the server")
    assert str(e.value) == ("the server needs fastapi, which is not installed: "
                            "pip install '.[serve]' (in the project's folder)")
    assert isinstance(e.value, UserError) and isinstance(e.value, ImportError)


def test_installed_but_broken_is_told_apart(tmp_path, monkeypatch):
    (tmp_path / "brokenpkg_h2").mkdir()
    (tmp_path / "brokenpkg_h2" / "__init__.py").write_text("import a_dependency_that_is_not_there_h2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra, match=r"brokenpkg_h2, which cannot be imported .*a_dependency_that_is_not_there"
                                           r".*reinstall it with pip install '\.\[interop\]'"):
        require("brokenpkg_h2", "interop", "x")


def test_unknown_extra_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown extra"):
        require("json", "gui", "x")


@pytest.mark.parametrize("module", ["fastapi", "uvicorn"])
def test_serve_without_the_extra(module, cli, monkeypatch, tmp_path, one_line_error):
    """Checked before the model is read: the message is the same for any --model."""
    monkeypatch.setitem(sys.modules, module, None)
    r = cli("serve", "--model", tmp_path / "no-run", "--port", "0")
    one_line_error(r, "serve", module, "pip install '.[serve]'")


def test_serve_package_without_fastapi(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    for name in [m for m in sys.modules if m == "transformer.serve" or m.startswith("transformer.serve.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtra, match=r"transformer\.serve needs fastapi.*'\.\[serve\]'"):
        importlib.import_module("transformer.serve")


def _tiny_model():
    from transformer.model.config import ModelConfig
    from transformer.model import Transformer

    return Transformer(ModelConfig(vocab_size=12, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16))


def _tiny_lm():
    from transformer.model.config import ModelConfig
    from transformer.model import LanguageModel

    return LanguageModel(ModelConfig(kind="decoder-only", vocab_size=12, d_model=8, n_heads=2, d_ff=16, n_layers=1,
                                     max_len=16, norm_first=True))


# (function, call, package, extra)
API = {
    "from_marian": (lambda i: i.from_marian(object()), "transformers", "interop"),
    "to_marian": (lambda i: i.to_marian(_tiny_model()), "transformers", "interop"),
    "load_marian": (lambda i: i.load_marian("."), "transformers", "interop"),
    "from_llama": (lambda i: i.from_llama(object()), "transformers", "interop"),
    "to_gpt2": (lambda i: i.to_gpt2(_tiny_lm()), "transformers", "interop"),
    "to_ctranslate2_spec": (lambda i: i.to_ctranslate2_spec(_tiny_model(), [str(n) for n in range(12)]),
                            "ctranslate2", "export"),
    "export_onnx": (lambda i: i.export_onnx(_tiny_model(), "never-written"), "onnx", "export"),
    "export_onnx_lm": (lambda i: i.export_onnx_lm(_tiny_lm(), "never-written"), "onnx", "export"),
}


@pytest.mark.parametrize("name", list(API))
def test_interop_functions_without_their_package(name, monkeypatch):
    import transformer.interop as interop

    call, package, extra = API[name]
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(MissingExtra, match=rf"needs {package}, which is not installed: "
                                           rf"pip install '\.\[{extra}\]'"):
        call(interop)


def test_train_with_tensorboard_but_without_the_package(cli, tmp_path, monkeypatch, one_line_error):
    """Refused before anything is prepared or written."""
    corpus = write_corpus(tmp_path / "corpus", n_train=20, n_valid=4)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"dataset": "files", **{k: str(v) for k, v in corpus.items()},
                                      "vocab_size": 60, "model": {"preset": "toy"}, "max_steps": 2,
                                      "progress": False}), encoding="utf-8")
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    r = cli("train", "--config", config, "--out", tmp_path / "run", "--set", "tensorboard=true")
    one_line_error(r, "train", "tensorboard=true", "pip install '.[tensorboard]'")
    assert not (tmp_path / "run").exists()
