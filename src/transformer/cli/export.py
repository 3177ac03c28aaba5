"""``transformer export``: write a trained model in another toolkit's format.

    transformer export --model RUN_DIR --format ctranslate2 --out DIR [--quantization int8]
    transformer export --model RUN_DIR --format marian --out DIR
    transformer export --model RUN_DIR --format onnx --out DIR

Each directory gets a copy of the run's ``subwords.model`` and a README.txt on loading it.
A language model run (trained here, or imported by ``transformer import``) exports to
CTranslate2 (``ctranslate2.Generator``) or ONNX (one cached token step) with a copy of its
tokenizer file; a Marian export of it is refused in one line.
The export is written into a temporary directory beside DIR and renamed when complete, so
a failure leaves no half-written DIR. DIR must not exist, or be an empty directory.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

FORMATS = ("ctranslate2", "marian", "onnx")
ONNX_TOL = 1e-4
EPILOG = """\
--format marian writes a Hugging Face model with its tokenizer and the run's decoding
settings, which translates with no other file:

  transformer export --model runs/demo --format marian --out demo-marian
  python -c 'from transformers import pipeline
  print(pipeline("translation", model="demo-marian")("A dog runs.")[0]["translation_text"])'

(transformers 4.x; in 5.x, which has no translation pipeline, use MarianTokenizer and
MarianMTModel.generate as the README.txt written into the directory shows.)"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a model to CTranslate2, Hugging Face Marian or ONNX",
                       description="Write a trained model in another toolkit's format. Each format needs\n"
                                   "the export extra: pip install '.[export]' (in the project's folder).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    from ._options import new_directory

    if args.format not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {args.format!r}")
    if args.quantization is not None:
        if args.format != "ctranslate2":
            raise UserError(f"--quantization applies to --format ctranslate2 only, not {args.format}")
        from ..interop.ctranslate2 import QUANTIZATIONS

        if args.quantization not in QUANTIZATIONS:
            raise UserError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, "
                            f"got {args.quantization!r}")
    new_directory(args.out)
    out = Path(args.out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise UserError(f"{out}: already exists; give a new directory (or remove it first)")


# The packages each format needs (all in the ``export`` extra).
NEEDS = {"ctranslate2": ("ctranslate2",), "marian": ("transformers",), "onnx": ("onnxruntime", "onnx", "onnxscript")}


def run(args: argparse.Namespace) -> int:
    from ..data import Subwords
    from ..errors import UserError
    from ..extras import require
    from ..run import SUBWORDS, find_subwords, load_model, read_model_config, run_root

    _check(args)
    if read_model_config(args.model).decoder_only and args.format == "marian":
        raise UserError("--format marian exports a translation model; a language model exports to "
                        "--format ctranslate2 or onnx")
    for module in NEEDS[args.format]:
        require(module, "export", f"--format {args.format}")
    model, meta = load_model(Path(args.model))
    if model.cfg.decoder_only:
        return _language_model(args, model, meta)
    root = run_root(args.model)
    if root is not None and not (root / SUBWORDS).is_file() and (root / "source.spm").is_file():
        raise UserError(f"{args.model}: an imported Marian model (Marian's own tokenizer files); export writes a "
                        "translation model trained here, with its subwords.model (the Hugging Face folder it was "
                        "imported from is a Marian model already)")
    spm_path = find_subwords(args.model)
    subwords = Subwords.load(spm_path)
    if subwords.vocab_size != model.cfg.target_vocab_size:
        raise UserError(f"{spm_path}: {subwords.vocab_size} subwords, but the model was built for "
                        f"{model.cfg.target_vocab_size}; these files belong to different runs")

    def export(tmp: Path) -> tuple[str, str]:
        note = EXPORTERS[args.format](model, subwords, spm_path, tmp, args)
        return note, README[args.format].format(weights=meta["path"])

    out, note = _write(args, export, spm_path, SUBWORDS)
    print(f"wrote {out} ({args.format}{note}) from {meta['path']}")
    return 0


def _write(args, export, tokenizer: Path, tokenizer_name: str) -> tuple[Path, str]:
    """``export(tmp)`` writes the model into a temporary directory and returns a note on the
    export and the text of its README.txt; the directory gets that README.txt and a copy of
    the ``tokenizer`` file (as ``tokenizer_name``), and is renamed to ``--out`` when complete
    (``--out`` is absent or empty: :func:`_check`). Returns ``--out`` and the note. What the
    format cannot express, or a failed write, is a one-line error."""
    from ..errors import UserError
    from ..run import atomic_dir

    out, notes = Path(args.out).absolute(), []

    def fill(tmp: Path) -> None:
        note, readme = export(tmp)
        shutil.copyfile(tokenizer, tmp / tokenizer_name)
        (tmp / "README.txt").write_text(readme, encoding="utf-8")
        notes.append(note)

    try:
        atomic_dir(out, fill)
    except ValueError as e:  # the model has something the format cannot express
        raise UserError(f"--format {args.format}: {e}") from None
    except OSError as e:
        raise UserError(f"{out}: cannot write ({e.strerror or e})") from None
    return out, notes[0]


def _checked_onnx(diffs: dict[str, float]) -> str:
    """The note on an ONNX export whose graphs onnxruntime runs as the model computes
    (``diffs``: the largest absolute differences its check found); a one-line error when
    they differ by more than ``ONNX_TOL``, so that nothing is written."""
    from ..errors import UserError

    worst = max(diffs.values())
    if not worst <= ONNX_TOL:
        raise UserError(f"the ONNX export does not reproduce the model (max abs difference {worst:.3g} > "
                        f"{ONNX_TOL}); nothing was written")
    return f"checked with onnxruntime: max abs difference {worst:.1e}"


def _language_model(args, model, meta) -> int:
    """A language model to CTranslate2 (the spec and ``vocabulary.json``, one string per id)
    or ONNX (``lm_step.onnx``, checked with onnxruntime), with a copy of the tokenizer file
    and a README.txt."""
    from ..data.text import load_tokenizer
    from ..run.layout import read_stop_ids

    tokenizer = load_tokenizer(args.model)
    vocab = lm_vocabulary(tokenizer, model.cfg.vocab_size)
    stops = read_stop_ids(args.model, len(vocab)) or [model.cfg.eos_id]  # as generate ends its text

    def export(tmp: Path) -> tuple[str, str]:
        if args.format == "ctranslate2":
            from ..interop.ctranslate2 import save_ctranslate2_lm

            save_ctranslate2_lm(model, tmp, vocab, quantization=args.quantization)
            return (f"{args.quantization or 'float32'} weights",
                    LM_README.format(weights=meta["path"], tokenizer=tokenizer.path.name,
                                     stops=[vocab[i] for i in stops]))
        from ..interop.onnx_lm import check_onnx_lm, export_onnx_lm

        export_onnx_lm(model, tmp)
        return (_checked_onnx(check_onnx_lm(model, tmp)),
                LM_ONNX_README.format(weights=meta["path"], tokenizer=tokenizer.path.name, stops=stops))

    out, note = _write(args, export, tokenizer.path, tokenizer.path.name)
    print(f"wrote {out} ({args.format} language model, {note}, tokenizer {tokenizer.path.name}) from {meta['path']}")
    return 0


def lm_vocabulary(tokenizer, size: int) -> list[str]:
    """One string per id of a language model, as CTranslate2 takes its tokens: the tokenizer's
    pieces in id order; ids the tokenizer lacks (Qwen2 pads its embedding) are ``<unused_N>``."""
    from ..data.chars import FIRST_ID, Chars
    from ..data.hf_tokenizer import PretrainedTokenizer, SentencePieceTokenizer

    if isinstance(tokenizer, PretrainedTokenizer):
        pieces = [tokenizer.tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    elif isinstance(tokenizer, SentencePieceTokenizer):
        pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    elif isinstance(tokenizer, Chars):
        pieces = ["<pad>", "<s>", "</s>"][:FIRST_ID] + tokenizer.chars
    else:  # LineSubwords
        pieces = tokenizer.subwords.vocab()
    pieces = pieces[:size] + [None] * (size - len(pieces))
    return [f"<unused_{i}>" if p is None else p for i, p in enumerate(pieces)]


def _ctranslate2(model, subwords, spm_path, tmp: Path, args) -> str:
    from ..interop.ctranslate2 import save_ctranslate2

    save_ctranslate2(model, tmp, subwords.vocab(), quantization=args.quantization)
    return f", {args.quantization or 'float32'} weights"


def _marian(model, subwords, spm_path, tmp: Path, args) -> str:
    from transformers.utils import logging as hf_logging

    from ..inference.front_door import run_decoding
    from ..interop.marian import save_marian
    from ..interop.marian_files import differences
    from ..run import read_run_config

    decoding = run_decoding(args.model)  # the run's own settings go into generation_config.json
    run = read_run_config(args.model)
    quiet = not hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" would be the only stderr output
    try:
        save_marian(model, tmp, subwords, decoding=decoding,
                    source_lang=run.get("src_lang"), target_lang=run.get("tgt_lang"))
    finally:
        if not quiet:
            hf_logging.enable_progress_bar()
    search = "greedy" if decoding.beam == 1 else f"beam {decoding.beam}, alpha {decoding.alpha:g}"
    return "".join([f", {search}", *(f"; {d}" for d in differences(decoding))])


def _onnx(model, subwords, spm_path, tmp: Path, args) -> str:
    from ..interop.onnx import check_onnx, export_onnx

    export_onnx(model, tmp)
    return ", " + _checked_onnx(check_onnx(model, tmp))


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
    "marian": """A Hugging Face MarianMTModel exported by `transformer export` from {weights},
with its MarianTokenizer (source.spm and target.spm: the run's subwords.model; vocab.json;
tokenizer_config.json) and the run's decoding settings in generation_config.json.

    from transformers import pipeline                  # transformers 4.x
    translate = pipeline("translation", model=".")
    print(translate("A man is riding a bike.")[0]["translation_text"])

transformers 5 removed the translation pipeline; this is what it did, in any version:

    from transformers import MarianMTModel, MarianTokenizer
    tokenizer = MarianTokenizer.from_pretrained(".")
    model = MarianMTModel.from_pretrained(".").eval()
    batch = tokenizer(["A man is riding a bike."], return_tensors="pt", padding=True)
    print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))

The output is `transformer translate`'s, token for token, at beam 1 and at alpha 0 (pass
num_beams=1 or length_penalty=0.0 to generate or to the pipeline). With alpha > 0 a beam
output can differ: HF divides log-probabilities by len**length_penalty, we by GNMT's
((5 + len) / 6)**alpha. HF's length limit is one number (max_length, counting the start
token): max_len_b + 1 when the run's max_len_a is 0, else the model's max_len + 1.
generation_config.json also blocks PAD and BOS as next tokens, as our searches do.
MarianTokenizer strips leading and trailing spaces and drops unknown words from its
output, where `transformer translate` writes " ⁇ ".
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

LM_README = """A CTranslate2 language model exported by `transformer export` from {weights},
for ctranslate2.Generator, with the run's tokenizer ({tokenizer}). CTranslate2 takes tokens
as strings: vocabulary.json holds the string of each id, in id order.

    import json, ctranslate2
    vocab = json.load(open("vocabulary.json", encoding="utf-8"))
    generator = ctranslate2.Generator(".", compute_type="default")  # or "int8" to quantise on load
    ids = ...  # the prompt's ids from {tokenizer}, as `transformer generate` encodes it (BOS included if it adds one)
    result = generator.generate_batch([[vocab[i] for i in ids]], max_length=50, sampling_topk=1,
                                      include_prompt_in_result=False, end_token={stops})
    new_ids = result[0].sequences_ids[0]  # decode them with {tokenizer}

A tokenizer.json reads with `tokenizers.Tokenizer.from_file`, a tokenizer.model with
sentencepiece. end_token lists the tokens that end the model's text; greedy decoding
(sampling_topk=1) gives `transformer generate --temperature 0`'s tokens.
"""

LM_ONNX_README = """An ONNX graph of a language model exported by `transformer export` from {weights},
with the run's tokenizer ({tokenizer}): lm_step.onnx, one token step with the KV cache as
explicit inputs and outputs (tokens (B, 1) int64 and past_k_i / past_v_i (B, H_kv, T_past, D)
in; logits (B, V) and present_k_i / present_v_i out: feed them back as past_*). At the first
step feed zero-size (B, H_kv, 0, D) arrays; a prompt is fed one token at a time. Every token
is read as text (no padding): a batch holds prompts of one length. onnx_config.json lists the
model config and every input and output name.

    from transformer.interop.onnx_lm import greedy_onnx_lm
    new_ids = greedy_onnx_lm(".", prompt_ids, max_new_tokens=50)  # prompt_ids from {tokenizer}

is a complete greedy loop; the model's text ends at any of the ids {stops}.
"""
