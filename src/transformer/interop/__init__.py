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
from .marian import config_from_marian, config_to_marian, from_marian, load_marian, save_marian, to_marian
from .ctranslate2 import save_ctranslate2, save_ctranslate2_lm, to_ctranslate2_lm_spec, to_ctranslate2_spec
from .gpt2 import from_gpt2, to_gpt2
from .llama import from_llama, to_llama
from .layout import to_concat_layout
from .onnx import check_onnx, export_onnx, greedy_onnx
from .onnx_lm import check_onnx_lm, export_onnx_lm, greedy_onnx_lm
from .torch_nn import load_from_torch_nn

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
