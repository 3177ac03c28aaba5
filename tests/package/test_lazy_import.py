"""``from transformer import Translator, Generator`` works, and ``import transformer`` stays
light: torch is loaded on first use of a name that needs it, optional packages never."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import transformer

OPTIONAL = ["fastapi", "uvicorn", "transformers", "ctranslate2", "onnx", "onnxruntime", "tensorboard"]

PROBE = """
import json, sys
import transformer
bare = sorted(m for m in ("torch", "numpy", "sentencepiece") if m in sys.modules)
from transformer import Translator, Generator
print(json.dumps({"bare": bare, "translator": Translator.__module__, "generator": Generator.__module__,
                  "optional": sorted(m for m in %r if m in sys.modules)}))
""" % (OPTIONAL,)


def test_import_is_light_and_names_load_on_use():
    """In a fresh interpreter (this one has imported everything already)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["bare"] == []  # `import transformer` loads no torch, numpy or sentencepiece
    assert (seen["translator"], seen["generator"]) == ("transformer.inference.translator", "transformer.inference.generator")
    assert seen["optional"] == []  # and the Translator needs no optional package


def test_public_names_are_the_real_objects():
    from transformer.model.config import ModelConfig
    from transformer.inference.generator import Generator
    from transformer.model import KVCache, LanguageModel, Transformer
    from transformer.inference.translator import Translator

    assert (transformer.ModelConfig, transformer.Transformer, transformer.KVCache, transformer.LanguageModel,
            transformer.Translator, transformer.Generator) == (ModelConfig, Transformer, KVCache, LanguageModel,
                                                               Translator, Generator)
    assert {"Translator", "Generator", "Transformer", "ModelConfig"} <= set(dir(transformer))
    assert set(transformer.__all__) <= set(dir(transformer))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Translater'"):
        transformer.Translater  # noqa: B018
    with pytest.raises(ImportError):
        from transformer import Translater  # noqa: F401
