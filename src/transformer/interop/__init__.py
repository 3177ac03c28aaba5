"""Weights in and out of other implementations:

    torch.nn.Transformer   import (torch_nn.py)
    Hugging Face Marian    import and export (marian.py; needs ``transformers``)
    Hugging Face Llama     import and export of the language model (llama.py; ``transformers``)
    Hugging Face GPT-2     import and export of the language model (gpt2.py; ``transformers``)
    CTranslate2            export (ctranslate2.py; needs ``ctranslate2``): the translation
                           model to its Translator, the language model to its Generator
    ONNX                   export of the encoder and one decoder step with its KV cache, and
                           a check and greedy loop on onnxruntime (onnx.py; needs ``onnx``,
                           ``onnxscript`` and ``onnxruntime``); the language model's one
                           token step likewise (onnx_lm.py)

The optional packages (the ``export`` extra) are imported only when a function that needs
them is called.
"""
from importlib import import_module

# name -> the module that defines it, imported when the name is first asked for: importing one
# module of the package (the Marian or language-model import) does not load the others (the
# ONNX exports bring in torch's compiler, about 70 MB)
_WHERE = {
    **dict.fromkeys(("config_from_marian", "config_to_marian", "from_marian", "load_marian", "save_marian",
                     "to_marian"), "marian"),
    **dict.fromkeys(("save_ctranslate2", "save_ctranslate2_lm", "to_ctranslate2_lm_spec", "to_ctranslate2_spec"),
                    "ctranslate2"),
    "from_gpt2": "gpt2", "to_gpt2": "gpt2", "from_llama": "llama", "to_llama": "llama",
    "to_concat_layout": "sinusoid_permutation",
    **dict.fromkeys(("check_onnx", "export_onnx", "greedy_onnx"), "onnx"),
    **dict.fromkeys(("check_onnx_lm", "export_onnx_lm", "greedy_onnx_lm"), "onnx_lm"),
    "load_from_torch_nn": "torch_nn",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "load_from_torch_nn",
    "to_concat_layout",
    "save_ctranslate2",
    "to_ctranslate2_spec",
    "save_ctranslate2_lm",
    "to_ctranslate2_lm_spec",
    "from_llama",
    "to_llama",
    "from_gpt2",
    "to_gpt2",
    "export_onnx",
    "check_onnx",
    "greedy_onnx",
    "export_onnx_lm",
    "check_onnx_lm",
    "greedy_onnx_lm",
    "from_marian",
    "load_marian",
    "to_marian",
    "save_marian",
    "config_from_marian",
    "config_to_marian",
]
