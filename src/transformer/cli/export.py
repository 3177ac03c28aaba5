"""``transformer export``: write a trained model in another toolkit's format.

    transformer export --model RUN_DIR --format ctranslate2 --out DIR [--quantization int8]
    transformer export --model RUN_DIR --format marian --out DIR
    transformer export --model RUN_DIR --format onnx --out DIR

Each directory gets a copy of the run's ``subwords.model`` and a README.txt on loading it.
The export is written into a temporary directory beside DIR and renamed when complete, so
a failure leaves no half-written DIR. DIR must not exist, or be an empty directory.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

FORMATS = ("ctranslate2", "marian", "onnx")
ONNX_TOL = 1e-4


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model to CTranslate2, Hugging Face Marian or ONNX")
    p.add_argument("--model", required=True, help="run directory (or a .safetensors file inside one)")
    p.add_argument("--format", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMATS)}")
    p.add_argument("--out", required=True, help="output directory (must not exist, or be empty)")
    p.add_argument("--quantization", default=None, metavar="TYPE",
                   help="ctranslate2 only: store weights as int8 (or int8_float32, int16, float16, "
                        "bfloat16). CTranslate2 can also quantise an fp32 export when loading it "
                        "(Translator(path, compute_type='int8'))")
    p.set_defaults(func=run)


def _check(args) -> None:
    from ..errors import UserError

    if args.format not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {args.format!r}")
    if args.quantization is not None:
        if args.format != "ctranslate2":
            raise UserError(f"--quantization applies to --format ctranslate2 only, not {args.format}")
        from ..interop.ctranslate2 import QUANTIZATIONS

        if args.quantization not in QUANTIZATIONS:
            raise UserError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, "
                            f"got {args.quantization!r}")
    out = Path(args.out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise UserError(f"{out}: already exists; give a new directory (or remove it first)")


def _require(module: str) -> None:
    from ..errors import UserError

    try:
        __import__(module)
    except ImportError:
        raise UserError(f"this export needs the {module} package: pip install 'transformer[export]'") from None


def run(args: argparse.Namespace) -> int:
    from ..data import Subwords
    from ..errors import UserError
    from ..run import atomic_dir, find_subwords, load_model

    _check(args)
    _require({"ctranslate2": "ctranslate2", "marian": "transformers", "onnx": "onnxruntime"}[args.format])
    if args.format == "onnx":
        _require("onnx")
        _require("onnxscript")
    model, meta = load_model(Path(args.model))
    spm_path = find_subwords(args.model)
    subwords = Subwords.load(spm_path)
    if subwords.vocab_size != model.cfg.target_vocab_size:
        raise UserError(f"{spm_path}: {subwords.vocab_size} subwords, but the model was built for "
                        f"{model.cfg.target_vocab_size}; these files belong to different runs")

    out = Path(args.out).absolute()

    def fill(tmp: Path) -> None:
        nonlocal note
        note = EXPORTERS[args.format](model, subwords, spm_path, tmp, args)
        shutil.copyfile(spm_path, tmp / "subwords.model")
        (tmp / "README.txt").write_text(README[args.format].format(weights=meta["path"]), encoding="utf-8")

    note = ""
    try:
        atomic_dir(out, fill)  # out is absent or empty (checked above)
    except ValueError as e:  # the model has something the format cannot express
        raise UserError(f"--format {args.format}: {e}") from None
    except OSError as e:
        raise UserError(f"{out}: cannot write ({e.strerror or e})") from None
    print(f"wrote {out} ({args.format}{note}) from {meta['path']}")
    return 0


def _ctranslate2(model, subwords, spm_path, tmp: Path, args) -> str:
    from ..interop.ctranslate2 import save_ctranslate2

    save_ctranslate2(model, tmp, subwords.vocab(), quantization=args.quantization)
    return f", {args.quantization or 'float32'} weights"


def _marian(model, subwords, spm_path, tmp: Path, args) -> str:
    from transformers.utils import logging as hf_logging

    from ..interop.marian import save_marian

    quiet = not hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" would be the only stderr output
    try:
        save_marian(model, tmp)
    finally:
        if not quiet:
            hf_logging.enable_progress_bar()
    return ""


def _onnx(model, subwords, spm_path, tmp: Path, args) -> str:
    from ..errors import UserError
    from ..interop.onnx import check_onnx, export_onnx

    export_onnx(model, tmp)
    diffs = check_onnx(model, tmp)
    worst = max(diffs.values())
    if not worst <= ONNX_TOL:
        raise UserError(f"the ONNX graphs do not reproduce the model (max abs difference {worst:.3g} "
                        f"> {ONNX_TOL}); nothing was written")
    return f", checked with onnxruntime: max abs difference {worst:.1e}"


EXPORTERS = {"ctranslate2": _ctranslate2, "marian": _marian, "onnx": _onnx}

README = {
    "ctranslate2": """A CTranslate2 model exported by `transformer export` from {weights}.

    import ctranslate2, sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file="subwords.model")
    translator = ctranslate2.Translator(".", compute_type="default")  # or "int8" to quantise on load
    pieces = sp.encode("A man is riding a bike.", out_type=str)       # EOS is added by the model config
    result = translator.translate_batch([pieces], beam_size=4, length_penalty=0)
    print(sp.decode(result[0].hypotheses[0]))

length_penalty: CTranslate2 divides by len**p; `transformer translate --alpha` uses GNMT's
((5 + len) / 6)**alpha. They agree at 0 (CTranslate2's default is 1): with length_penalty=0
the two searches give the same tokens. suppress_sequences=[["<pad>"], ["<s>"]] would keep
PAD and BOS out, as ours does, but it renormalises each step's probabilities, so close beam
hypotheses can then rank differently from `transformer translate`.
""",
    "marian": """A Hugging Face MarianMTModel exported by `transformer export` from {weights}.
Tokenise with subwords.model (sentencepiece); HF's MarianTokenizer expects other files.

    import torch, sentencepiece as spm
    from transformers import MarianMTModel
    sp = spm.SentencePieceProcessor(model_file="subwords.model")
    model = MarianMTModel.from_pretrained(".", local_files_only=True).eval()
    ids = torch.tensor([sp.encode("A man is riding a bike.") + [sp.eos_id()]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=4, max_new_tokens=100)
    print(sp.decode(out[0].tolist()[1:]))  # drop the start token; sentencepiece skips EOS/PAD

generation_config.json already blocks PAD and BOS as next tokens. HF's length_penalty
divides by len**p; use length_penalty=0 to rank as `transformer translate --alpha 0` does.
""",
    "onnx": """ONNX graphs exported by `transformer export` from {weights}:
encoder.onnx (src -> memory and each decoder layer's cross-attention K/V) and
decoder_step.onnx (one target token with the self-attention KV cache as explicit inputs
and outputs). onnx_config.json lists the model config and every input and output name;
the docstring of transformer/interop/onnx.py gives the shapes.

    import numpy as np, onnxruntime as ort, sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file="subwords.model")
    src = np.array([sp.encode("A man is riding a bike.") + [sp.eos_id()]], dtype=np.int64)
    enc = ort.InferenceSession("encoder.onnx"); dec = ort.InferenceSession("decoder_step.onnx")
    memory, *cross = enc.run(None, {{"src": src}})
    # decoder_step inputs: tokens (B, 1), src_mask (B, S) bool, cross_k_i/cross_v_i,
    # past_k_i/past_v_i of shape (B, H, 0, D) at the first step; feed present_* back as past_*.

transformer.interop.onnx.greedy_onnx(dir, src, max_len) is a complete greedy loop.
""",
}
