"""Translation at the size people import: an opus-mt-en-de-shaped Marian, ours against
CTranslate2 and Hugging Face ``generate()``, side by side in one command.

The model: HF ``MarianConfig`` as opus-mt-en-de (d_model 512, 6+6 layers, 8 heads, FFN 2048,
swish, sinusoidal positions, one vocabulary for both sides tied to the output), random
weights, with sentencepiece models trained on the Multi30k training text (source on English,
target on German) and Marian's vocab.json (``</s>`` 0, ``<unk>`` 1, the pieces of both, filler
pieces up to ``--vocab``, ``<pad>`` last: opus-mt-en-de's 58,101), ``generation_config``
``max_length`` 64 and 4 beams. It is saved by ``save_pretrained``, imported with ``transformer
import`` and converted with CTranslate2's own ``ct2-transformers-converter``; all of it is built
once into ``--work`` and reused from there (a folder of another shape is refused). EOS gets a
logit bias of -1e4, so that no system ends a translation before the length limit: every one
decodes ``max_length - 1`` steps for every hypothesis, the same work.

Timed, on the first ``--n`` test_2016_flickr English sentences, in the same batches (sorted by
length, at most our ``max_tokens`` padded source tokens, as ``transformer translate`` makes
them), beam 4, ``--threads`` threads each:

    ours-P       ``transformer translate``'s work (``Translator``, ``--precision P``, eager);
                 ``auto`` is what the command does by default (bf16 on a CPU with native bf16)
    ct2-T        CTranslate2's ``translate_batch`` at ``compute_type`` T, on the same pieces,
                 the model loaded for its own turn only (benchmarks/turns.py)
    hf-fp32      ``MarianMTModel.generate()`` with the folder's generation config

Rounds rotate which system goes first; figures are medians over rounds. Each system's
multiply-adds are counted from the shapes and what it decoded (:func:`multiply_adds`), and its
sustained rate is set against ``benchmarks/matmul_rate.py``'s fp32 and bf16 rates, measured in
the same process before and after the rounds (the higher of the two). Prints the machine and
the load average.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/real_size.py --work DIR \\
        [--n 200] [--rounds 3] [--threads 2] [--systems ...] [--json results.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))
from matmul_rate import matmul_rate  # noqa: E402
from turns import its_turn  # noqa: E402

from transformer import hardware  # noqa: E402
from transformer.decode.decoding_config import PRECISIONS  # noqa: E402

SYSTEMS = ("ours-auto", "ours-int8", "ours-fp32", "ct2-int8", "ct2-float32", "hf-fp32")
FILLER = "\u2581fill{}"  # the pieces that pad vocab.json to --vocab (a word start, never produced by the spm models)


class BadInput(Exception):
    """A one-line message for the user (exit 2)."""


# ---- building the model folder, the run and the CTranslate2 model --------------------------------
def shape_of(args) -> dict:
    return {"d_model": args.d_model, "layers": args.layers, "heads": args.heads, "ffn": args.ffn,
            "vocab": args.vocab, "spm_vocab": args.spm_vocab, "train_lines": args.train_lines,
            "max_length": args.max_length, "beam": args.beam, "seed": args.seed}


def train_spm(lang: str, prefix: Path, vocab_size: int, lines: int) -> None:
    import sentencepiece as spm

    from transformer.data.registry import load_multi30k_text

    text = load_multi30k_text("train", lang, download=False).splitlines()
    text = text[:lines] if lines else text
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(prefix), vocab_size=vocab_size,
                                   character_coverage=1.0, minloglevel=2, num_threads=1, hard_vocab_limit=False)


def marian_vocab(models, size: int) -> dict[str, int]:
    """Marian's vocab.json: ``</s>`` 0, ``<unk>`` 1, the pieces of every model, fillers up to
    ``size - 1`` entries, ``<pad>`` last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for sp in models:
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    if len(vocab) + 1 > size:
        raise BadInput(f"--vocab {size} is smaller than the sentencepiece models' {len(vocab) + 1} pieces; "
                       "give a larger --vocab or a smaller --spm-vocab")
    k = 0
    while len(vocab) < size - 1:
        vocab.setdefault(FILLER.format(k), len(vocab))
        k += 1
    vocab["<pad>"] = len(vocab)
    return vocab


@torch.no_grad()
def build_marian(out: Path, shape: dict, tmp: Path) -> None:
    """The HF folder (module docstring) in ``out``, built in ``tmp`` first."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    tmp.mkdir(parents=True)
    for side, lang in (("source", "en"), ("target", "de")):
        train_spm(lang, tmp / side, shape["spm_vocab"], shape["train_lines"])
    models = [spm.SentencePieceProcessor(model_file=str(tmp / f"{side}.model")) for side in ("source", "target")]
    vocab = marian_vocab(models, shape["vocab"])
    (tmp / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    folder = tmp / "hf"
    MarianTokenizer(str(tmp / "source.model"), str(tmp / "target.model"), str(tmp / "vocab.json"), source_lang="en",
                    target_lang="de").save_pretrained(folder)
    pad = vocab["<pad>"]
    torch.manual_seed(shape["seed"])
    d = shape["d_model"]
    hf = MarianMTModel(MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, d_model=d, encoder_layers=shape["layers"], decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"], encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"], max_position_embeddings=512, activation_function="swish",
        scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=0)).eval()
    hf.final_logits_bias[0, 0] = -1e4  # EOS never wins: every system decodes to the length limit
    hf.generation_config.update(num_beams=shape["beam"], max_length=shape["max_length"], bad_words_ids=[[pad]],
                                decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, pad_token_id=pad)
    hf.save_pretrained(folder)
    folder.rename(out)


def converter() -> str:
    """CTranslate2's ``ct2-transformers-converter``: beside this Python, else on PATH."""
    found = shutil.which("ct2-transformers-converter", path=str(Path(sys.executable).parent)) or \
        shutil.which("ct2-transformers-converter")
    if not found:
        raise BadInput("ct2-transformers-converter not found: pip install ctranslate2 (into this environment)")
    return found


def run_step(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no message)"]
        raise BadInput(f"{what} failed: {tail[0]}")


def prepare(work: Path, shape: dict, log) -> dict[str, Path]:
    """The HF folder, our imported run and the CTranslate2 model under ``work``: each built when
    missing (in a temporary folder, renamed into place when whole), reused when present."""
    if work.exists() and not work.is_dir():
        raise BadInput(f"--work {work}: not a folder")
    work.mkdir(parents=True, exist_ok=True)
    shape_file = work / "shape.json"
    if shape_file.is_file():
        try:
            held = json.loads(shape_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise BadInput(f"{shape_file}: unreadable; remove --work {work} or give a new folder") from None
        if held != shape:
            diff = ", ".join(f"{k} {held.get(k)} (asked {v})" for k, v in shape.items() if held.get(k) != v)
            raise BadInput(f"--work {work} holds a model of another shape: {diff}; give a new folder")
    elif any(work.iterdir()):
        raise BadInput(f"--work {work}: not empty and not this benchmark's folder (no shape.json); give a new folder")
    else:
        shape_file.write_text(json.dumps(shape, indent=1), encoding="utf-8")
    paths = {"hf": work / "hf", "run": work / "run", "ct2": work / "ct2"}
    for name in paths:  # leftovers of an interrupted build
        shutil.rmtree(work / f"{name}.tmp", ignore_errors=True)
    if not paths["hf"].is_dir():
        log("building the Marian folder (sentencepiece on Multi30k train, random weights, save_pretrained)")
        t = time.perf_counter()
        build_marian(paths["hf"], shape, work / "hf.tmp")
        shutil.rmtree(work / "hf.tmp", ignore_errors=True)
        log(f"  {time.perf_counter() - t:.0f} s")
    if not paths["run"].is_dir():
        log("transformer import")
        run_step([sys.executable, "-m", "transformer", "import", str(paths["hf"]), "--out", str(work / "run.tmp")],
                 "transformer import")
        (work / "run.tmp").rename(paths["run"])
    if not paths["ct2"].is_dir():
        log("ct2-transformers-converter")
        run_step([converter(), "--model", str(paths["hf"]), "--output_dir", str(work / "ct2.tmp")],
                 "ct2-transformers-converter")
        (work / "ct2.tmp").rename(paths["ct2"])
    return paths


# ---- the systems: batches of source ids (with EOS) -> content ids of each --------------------------
class Ours:
    def __init__(self, run: Path, precision: str, beam: int):
        from transformer.inference.translator import load_translator

        self.translator = load_translator(run, warn=False, beam=beam, precision=precision, compile="off")
        self.precision = self.translator.decoding.precision

    def __call__(self, lines: list[str], batches, ids) -> list[list[int]]:
        return [r[0].tokens for r in self.translator.translate_nbest(lines, 1)]


class HF:
    def __init__(self, folder: Path, pad: int, eos: int):
        from transformers import MarianMTModel

        self.model = MarianMTModel.from_pretrained(folder, local_files_only=True).eval()
        self.pad, self.eos = pad, eos

    @torch.inference_mode()
    def __call__(self, lines, batches, ids) -> list[list[int]]:
        from transformer.decode import pad_batch

        out: list[list[int]] = [[] for _ in lines]
        for batch in batches:
            src = pad_batch([ids[i] for i in batch], self.pad)
            rows = self.model.generate(input_ids=src, attention_mask=(src != self.pad).long()).tolist()
            for i, row in zip(batch, rows):
                out[i] = content(row[1:], self.eos, self.pad)
        return out


class CT2:
    """CTranslate2's Translator, loaded only for its own turn (benchmarks/turns.py)."""

    def __init__(self, path: Path, compute_type: str, threads: int, pieces: list[str], beam: int, steps: int):
        self.path, self.compute_type, self.threads = path, compute_type, threads
        self.pieces, self.beam, self.steps = pieces, beam, steps
        self.index = {p: i for i, p in enumerate(pieces)}
        self.translator = None

    def open(self) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(str(self.path), device="cpu", compute_type=self.compute_type,
                                                 intra_threads=self.threads, inter_threads=1)

    def close(self) -> None:
        self.translator = None
        gc.collect()

    def __call__(self, lines, batches, ids) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in lines]
        for batch in batches:  # the pieces as MarianTokenizer gives them, </s> included
            res = self.translator.translate_batch([[self.pieces[t] for t in ids[i]] for i in batch],
                                                  beam_size=self.beam, max_decoding_length=self.steps,
                                                  max_batch_size=0)
            for i, r in zip(batch, res):
                out[i] = [self.index[p] for p in r.hypotheses[0]]
        return out


def content(ids: list[int], eos: int, pad: int) -> list[int]:
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return [t for t in ids if t != pad]


# ---- work done ------------------------------------------------------------------------------------
def multiply_adds(src_lens: list[int], steps: list[int], beam: int, d: int, layers: int, ffn: int,
                  vocab: int) -> dict[str, float]:
    """The multiply-adds of the work itself, the same for every system: the encoder on each
    source's tokens (no padding), the decoder's memory keys and values once a sentence, and per
    decoder step and beam row the projections, the FFN, both attentions over the positions
    there are, and the output projection. ``steps``: the decoder steps of each sentence."""
    enc = dec = cross_kv = out = 0.0
    for S, T in zip(src_lens, steps):
        enc += layers * (S * (4 * d * d + 2 * d * ffn) + 2 * S * S * d)
        cross_kv += layers * S * 2 * d * d
        attn = sum(2 * t * d + 2 * S * d for t in range(1, T + 1))  # self over t positions, cross over S
        dec += beam * layers * (T * (6 * d * d + 2 * d * ffn) + attn)
        out += beam * T * d * vocab
    return {"encoder": enc, "decoder": dec + cross_kv, "output_projection": out, "total": enc + dec + cross_kv + out}


# ---- the race -------------------------------------------------------------------------------------
def plan(ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """``Translator``'s batches: sorted by length, grown while the padded size fits ``max_tokens``."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(ids[order[end]]) <= max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for the built model, run and CTranslate2 model "
                                                  "(reused when it holds them)")
    ap.add_argument("--n", type=positive, default=200, help="test_2016_flickr sentences")
    ap.add_argument("--rounds", type=positive, default=3)
    ap.add_argument("--threads", type=positive, default=2, help="intra-op threads of every system")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated: ours-P (P: auto, fastest, fp32, bf16, int8), ct2-T (T: a compute_type), hf-fp32")
    ap.add_argument("--beam", type=positive, default=4)
    ap.add_argument("--max-length", type=positive, default=64, help="generation_config max_length")
    ap.add_argument("--d-model", type=positive, default=512)
    ap.add_argument("--layers", type=positive, default=6, help="encoder and decoder layers each")
    ap.add_argument("--heads", type=positive, default=8)
    ap.add_argument("--ffn", type=positive, default=2048)
    ap.add_argument("--vocab", type=positive, default=58101, help="vocab.json's size (opus-mt-en-de's)")
    ap.add_argument("--spm-vocab", type=positive, default=8000, help="pieces of each sentencepiece model")
    ap.add_argument("--train-lines", type=int, default=0, help="Multi30k train lines the spm models learn on (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--matmul-sizes", default="1024,2048", help="benchmarks/matmul_rate.py's square sizes")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.d_model % args.heads:
        ap.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.max_length < 2:
        ap.error("--max-length must be at least 2 (the start token and one more)")
    try:
        args.sizes = tuple(positive(s) for s in args.matmul_sizes.split(","))
    except (ValueError, argparse.ArgumentTypeError):
        ap.error(f"--matmul-sizes {args.matmul_sizes!r}: give positive integers, comma-separated")
    args.names = [s for s in args.systems.split(",") if s]
    for name in args.names:
        kind, _, q = name.partition("-")
        if not ((kind == "ours" and q in PRECISIONS) or (kind == "ct2" and q)
                or name == "hf-fp32") or args.names.count(name) > 1:
            ap.error(f"--systems: {name!r} is not one of ours-P ({', '.join(PRECISIONS)}), ct2-T, hf-fp32, once each")
    return args


def rates(sizes) -> dict[str, float]:
    """matmul_rate.py's fp32 and bf16 rates, per second of wall time and (``cpu_*``) of CPU time."""
    dtypes = (("fp32", torch.float32), ("bf16", torch.bfloat16))
    return {**{name: matmul_rate(dtype, sizes) for name, dtype in dtypes},
            **{f"cpu_{name}": matmul_rate(dtype, sizes, clock=time.process_time) for name, dtype in dtypes}}


def main() -> int:
    args = parse()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    from transformer.data import load_multi30k
    from transformer.errors import UserError

    shape = shape_of(args)
    try:
        paths = prepare(Path(args.work), shape, log)
        lines = [s for s, _ in load_multi30k("test_2016_flickr", "en", "de", download=False)][: args.n]
    except (BadInput, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load = [os.getloadavg()[0]]
    matmul = [rates(args.sizes)]
    log("matmul rate (GFLOP/s): " + ", ".join(f"{k} {v / 1e9:,.0f}" for k, v in matmul[0].items()))

    systems: dict[str, object] = {}
    for name in args.names:  # ours first: their translator gives the ids and the batches
        kind, _, q = name.partition("-")
        if kind == "ours":
            systems[name] = Ours(paths["run"], q, args.beam)
    probe = next(iter(systems.values()), None) or Ours(paths["run"], "fp32", args.beam)
    tr = probe.translator
    cfg = tr.model.cfg
    ids = [tr.encode(line) for line in lines]
    batches = plan(ids, tr.decoding.max_tokens)
    pieces = [p for p, _ in sorted(json.loads((paths["hf"] / "vocab.json").read_text(encoding="utf-8")).items(),
                                   key=lambda kv: kv[1])]
    for name in args.names:
        kind, _, q = name.partition("-")
        if kind == "ct2":
            systems[name] = CT2(paths["ct2"], q, args.threads, pieces, args.beam, args.max_length - 1)
        elif kind == "hf":
            systems[name] = HF(paths["hf"], cfg.pad_id, cfg.eos_id)
    systems = {n: systems[n] for n in args.names}
    labels = {n: (f"ours --precision {n[5:]}" + (f" ({s.precision})" if n[5:] == "auto" else "")
                  if n.startswith("ours") else f"CTranslate2 {n[4:]}" if n.startswith("ct2") else "HF generate() fp32")
              for n, s in systems.items()}

    times: dict[str, list[float]] = {n: [] for n in systems}
    cpu: dict[str, list[float]] = {n: [] for n in systems}  # the process's CPU time: what the load does not stretch
    outs: dict[str, list[list[int]]] = {}
    limit = args.max_length - 1  # decoder steps at most (the last one's token: EOS, forced, or none)
    src_lens = [len(x) for x in ids]
    # compared up to the last word: CTranslate2 keeps one there where the others force EOS
    same = lambda a, b: a[: limit - 1] == b[: limit - 1]  # noqa: E731

    def summary(rounds: int) -> dict:
        peak = {k: max(m[k] for m in matmul) for k in matmul[0]}
        result = {"machine": hardware.describe(), "shape": shape, "sentences": len(lines), "rounds": rounds,
                  "threads": args.threads, "batches": len(batches), "max_tokens": tr.decoding.max_tokens,
                  "load_average": load, "matmul_flops": peak, "systems": {}}
        ref = outs.get("ours-fp32")
        for n in systems:
            steps = [min(len(o) + 1, limit) for o in outs[n]]
            work = multiply_adds(src_lens, steps, args.beam, cfg.d_model, cfg.n_layers, shape["ffn"],
                                 cfg.target_vocab_size)
            med = statistics.median(times[n])
            result["systems"][n] = {
                "label": labels[n], "seconds": times[n], "median_s": med, "cpu_seconds": cpu[n],
                "median_cpu_s": statistics.median(cpu[n]), "decoder_steps": sum(steps),
                "tokens": sum(len(o) for o in outs[n]), "multiply_adds": work,
                "mac_per_s": work["total"] / med, "mac_per_cpu_s": work["total"] / statistics.median(cpu[n]),
                "same_as_ours_fp32": None if ref is None else
                sum(same(a, b) for a, b in zip(outs[n], ref))}
        return result

    for r in range(args.rounds):
        names = args.names[r % len(args.names):] + args.names[: r % len(args.names)]
        for n in names:
            with its_turn(systems[n]):
                t, c = time.perf_counter(), time.process_time()
                outs[n] = systems[n](lines, batches, ids)
                times[n].append(time.perf_counter() - t)
                cpu[n].append(time.process_time() - c)
            log(f"round {r + 1}/{args.rounds}: {n} {times[n][-1]:.1f} s ({cpu[n][-1]:.1f} s of CPU)")
        load.append(os.getloadavg()[0])
        if args.json and r + 1 < args.rounds:  # the rounds so far, should the run be cut short
            Path(args.json).write_text(json.dumps(summary(r + 1), indent=1), encoding="utf-8")
    matmul.append(rates(args.sizes))
    result = summary(args.rounds)
    print(report(result, args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def report(result: dict, args) -> str:
    s, peak = result["systems"], result["matmul_flops"]
    base = {k: s[k]["median_s"] for k in ("ct2-int8", "ct2-float32", "hf-fp32") if k in s}
    lines = [f"{result['sentences']} test_2016_flickr sentences in {result['batches']} batches (max_tokens "
             f"{result['max_tokens']}), beam {args.beam}, max_length {args.max_length}, {args.threads} threads, "
             f"{args.rounds} rounds (medians); model d_model {args.d_model}, {args.layers}+{args.layers} layers, "
             f"{args.heads} heads, FFN {args.ffn}, vocabulary {args.vocab}; torch {torch.__version__}; load average "
             + " ".join(f"{x:.1f}" for x in result["load_average"]) + " (start, after each round)",
             f"matmul rate (benchmarks/matmul_rate.py, sizes {args.matmul_sizes}): fp32 {peak['fp32'] / 1e9:,.0f} "
             f"GFLOP/s, bf16 {peak['bf16'] / 1e9:,.0f} GFLOP/s (one multiply-add = 2 FLOP); per second of CPU time "
             f"fp32 {peak['cpu_fp32'] / 1e9:,.0f}, bf16 {peak['cpu_bf16'] / 1e9:,.0f}", "",
             "| system | seconds | rounds, s | against CT2 int8 | against CT2 float32 | against HF | CPU seconds | "
             "CPU against CT2 int8 | decoder steps | GMAC/s | of the fp32 matmul rate | of the bf16 matmul rate | "
             "GMAC per CPU second | of the fp32 / bf16 rate per CPU second | output projection share | "
             "same tokens as ours fp32 |", "|---|" + "---|" * 15]
    for n, c in s.items():
        rel = [f"{c['median_s'] / base[k]:.2f}x" if k in base else "" for k in ("ct2-int8", "ct2-float32", "hf-fp32")]
        rate, cpu_rate = c["mac_per_s"] * 2, c["mac_per_cpu_s"] * 2
        cpu_rel = f"{c['median_cpu_s'] / s['ct2-int8']['median_cpu_s']:.2f}x" if "ct2-int8" in s else ""
        same = "" if c["same_as_ours_fp32"] is None else f"{c['same_as_ours_fp32']}/{result['sentences']}"
        lines.append(f"| {c['label']} | {c['median_s']:.1f} | {' '.join(f'{x:.1f}' for x in c['seconds'])} | "
                     + " | ".join(rel) + f" | {c['median_cpu_s']:.1f} | {cpu_rel} | {c['decoder_steps']} | "
                     f"{c['mac_per_s'] / 1e9:,.1f} | "
                     f"{rate / peak['fp32']:.0%} | {rate / peak['bf16']:.0%} | {c['mac_per_cpu_s'] / 1e9:,.1f} | "
                     f"{cpu_rate / peak['cpu_fp32']:.0%} / {cpu_rate / peak['cpu_bf16']:.0%} | "
                     f"{c['multiply_adds']['output_projection'] / c['multiply_adds']['total']:.0%} | {same} |")
    ours = {n: c["median_s"] for n, c in s.items() if n.startswith("ours")}

    def ratio(a: str, b: str) -> str:
        return (f"{s[a]['median_s'] / s[b]['median_s']:.2f}x wall time, "
                f"{s[a]['median_cpu_s'] / s[b]['median_cpu_s']:.2f}x CPU time")

    goals = []
    if ours and "ct2-int8" in s:
        best = min(ours, key=ours.get)
        goals.append(f"ours at its fastest ({best}) / CT2 int8: {ratio(best, 'ct2-int8')} (goal <= 1.0x)")
    if "ours-fp32" in ours and "ct2-float32" in s:
        goals.append(f"ours fp32 / CT2 float32: {ratio('ours-fp32', 'ct2-float32')} (goal <= 0.9x)")
    if "ours-fp32" in ours and "hf-fp32" in s:
        goals.append(f"ours fp32 / HF generate(): {ratio('ours-fp32', 'hf-fp32')} (goal <= 0.7x)")
    return "\n".join(lines + [""] + goals)


if __name__ == "__main__":
    sys.exit(main())
