"""Decoding throughput: ours vs Hugging Face generate() vs CTranslate2, on the same weights.

Every system decodes the same sentences in the same batches, with the same search: beam 4
or greedy, ranking by raw log-probability (our alpha=0 = HF's and CTranslate2's
length_penalty=0; the three length penalties differ otherwise), PAD and BOS never emitted.
Systems (all from one model):

    ours-fp32   greedy_search / beam_search, float32 (the reference for every check)
    ours-bf16   the same on bfloat16 weights (transformer.decode.precision, --precision bf16)
    ours-int8   the same after int8 dynamic quantisation of every linear layer and the output
                projection (transformer.decode.precision, --precision int8)
    ours-fp32-compiled  the same searches through one compiled step on a fixed-shape cache
                (greedy_search / beam_search given transformer.compiled.step); not in the
                default --systems. Its first round includes the compilations.
    ours-bf16-compiled, ours-int8-compiled  the same on bfloat16 / int8 weights
    hf-fp32     transformers MarianMTModel.generate() on to_marian(model)
    ct2-fp32    CTranslate2 on our exporter's output (transformer.interop.ctranslate2)
    ct2-int8    the same, compute_type="int8" (weights quantised when loading)

Parts (one process; within a part the systems take turns round after round, so machine
noise hits all of them alike; figures are medians over rounds):

    A  the trained model on the first N Multi30k test_2016_flickr en->de sentences: batch 1
       and 32, beam 4 and greedy; target tokens/s and sentences/s, ratios to ours-fp32,
       outputs differing from ours-fp32 at batch 1, and sacreBLEU of each system's output
    B  time against sentence length: 32 synthetic sources of 10/20/40/80 subwords, output
       length forced to the same (min and max length), beam 4, batch 32
    C  the paper's base model (6+6, d_model 512, random weights), 64 test sentences, 20
       target tokens forced, beam 4, batch 32 (the shape of the peers' anchor figures)
    M  peak memory: each system in a fresh child process (only the imports it needs: no torch
       for CTranslate2; "python+torch" is the imports of ours and HF without a model),
       decoding part A's sentences at beam 4, batch 32; peak RSS = VmHWM of /proc/self/status
    Q  quality on the whole test set (1,000 sentences), beam 4 and greedy, batch 32, untimed:
       sacreBLEU of each system and the number of outputs differing from ours-fp32

Tokens counted are the generated target subwords without EOS (forced runs: the forced
count). Threads: every system gets --threads intra-op threads.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/decode/run.py \\
        [--run runs/demo] [--n 64] [--rounds 3] [--parts A,B,C,Q,M] [--out results.json]
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
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))
from peak_memory import peak_rss_mib  # noqa: E402
from turns import its_turn  # noqa: E402

from transformer import ModelConfig, Transformer, hardware  # noqa: E402
from transformer.data import Subwords, load_multi30k
from transformer.decode import beam_search, greedy_search, pad_batch
from transformer.decode.precision import for_inference
from transformer.evaluation.translation import score

SYSTEMS = ("ours-fp32", "ours-bf16", "ours-int8", "hf-fp32", "ct2-fp32", "ct2-int8")
MAX_NEW = 100  # free-running limit (content tokens); trained outputs end far before it

Decode = Callable[[list[list[int]], int, int | None], list[list[int]]]


# ---- the systems: (source ids without EOS, beam, forced length or None) -> output ids -----------
def ours(model: Transformer, precision: str = "fp32", compile: str = "off", compiled_step=None) -> Decode:
    """Our searches; ``compile="on"``: through the compiled step (``compiled_step(model, beam)``,
    default :func:`transformer.compiled.step`), but eagerly for an int8 model on fbgemm's int8
    GEMM, as the front door decides (a compiled step cannot call it)."""
    from transformer import compiled
    from transformer.decode.precision import uses_int8_gemm

    model = for_inference(model, precision)
    cfg = model.cfg
    compiles = compile == "on" and not uses_int8_gemm(model)
    make_step = compiled_step or compiled.step

    @torch.inference_mode()
    def run(srcs, beam, forced):
        src = pad_batch([s + [cfg.eos_id] for s in srcs], cfg.pad_id)
        n = (forced or MAX_NEW) + 1  # + EOS
        kw = dict(max_len_a=0.0, max_len_b=n, min_length=n if forced else 0)
        step = make_step(model, beam) if compiles else None
        hyps = (greedy_search(model, src, step=step, **kw) if beam == 1
                else beam_search(model, src, beam_size=beam, alpha=0.0, step=step, **kw))
        return [_strip(h[0].tokens, cfg.eos_id) for h in hyps]

    run.model = model  # the model it decodes with (converted to the precision)
    return run


def hf(model: Transformer, hf_model=None) -> Decode:
    from transformer.interop import to_marian

    hf_model = (hf_model or to_marian(model)).eval()
    cfg = model.cfg

    @torch.inference_mode()
    def run(srcs, beam, forced):
        src = pad_batch([s + [cfg.eos_id] for s in srcs], cfg.pad_id)
        kw = dict(min_new_tokens=forced, max_new_tokens=forced + 1) if forced else dict(max_new_tokens=MAX_NEW + 1)
        if beam > 1:
            kw.update(length_penalty=0.0, early_stopping=False)
        out = hf_model.generate(input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam,
                                do_sample=False, **kw)
        return [_strip(row[1:], cfg.eos_id, cfg.pad_id) for row in out.tolist()]

    return run


class ct2:
    """CTranslate2's Translator, loaded only for its own turn (``turns.py``: alive, it slows
    the torch systems in the process, which would flatter CTranslate2 in the race)."""

    def __init__(self, path: Path, vocab: list[str], compute_type: str, threads: int):
        self.path, self.vocab, self.compute_type, self.threads = path, vocab, compute_type, threads
        self.piece_id = {p: i for i, p in enumerate(vocab)}
        self.translator = None

    def open(self) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(str(self.path), device="cpu", compute_type=self.compute_type,
                                                 intra_threads=self.threads, inter_threads=1)

    def close(self) -> None:
        self.translator = None  # its threads end with it
        gc.collect()

    def __call__(self, srcs, beam, forced):
        kw = dict(min_decoding_length=forced, max_decoding_length=forced + 1) if forced else \
            dict(max_decoding_length=MAX_NEW + 1)
        res = self.translator.translate_batch([[self.vocab[i] for i in s] for s in srcs], beam_size=beam,
                                              length_penalty=0.0, max_batch_size=0, **kw)
        # At the length limit ours and HF force EOS; CTranslate2 keeps one more token instead.
        return [[self.piece_id[t] for t in r.hypotheses[0]][: forced or MAX_NEW] for r in res]


def _strip(ids: list[int], eos: int, pad: int | None = None) -> list[int]:
    """Content tokens: up to the first EOS, without padding."""
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return [t for t in ids if t != pad]


def build(model: Transformer, vocab: list[str], workdir: Path, threads: int, names=SYSTEMS) -> dict[str, Decode]:
    from transformer.interop.ctranslate2 import save_ctranslate2

    systems: dict[str, Decode] = {}
    ct2_dir = Path(tempfile.mkdtemp(prefix="ct2-", dir=workdir))
    if any(n.startswith("ct2") for n in names):
        save_ctranslate2(model, ct2_dir, vocab)
    for name in names:
        systems[name] = {
            "ours-fp32": lambda: ours(model),
            "ours-bf16": lambda: ours(model, "bf16"),
            "ours-int8": lambda: ours(model, "int8"),
            "ours-fp32-compiled": lambda: ours(model, compile="on"),
            "ours-bf16-compiled": lambda: ours(model, "bf16", compile="on"),
            "ours-int8-compiled": lambda: ours(model, "int8", compile="on"),
            "hf-fp32": lambda: hf(model),
            "ct2-fp32": lambda: ct2(ct2_dir, vocab, "float32", threads),
            "ct2-int8": lambda: ct2(ct2_dir, vocab, "int8", threads),
        }[name]()
    return systems


# ---- timing -------------------------------------------------------------------------------------
def batches(srcs: list[list[int]], size: int) -> list[list[int]]:
    """Index chunks of ``size``, sentences sorted by length (the same chunks for everyone)."""
    order = sorted(range(len(srcs)), key=lambda i: len(srcs[i]))
    return [order[i: i + size] for i in range(0, len(order), size)]


def job(decode: Decode, srcs, bsz: int, beam: int, forced: int | None):
    """Time ``decode`` on ``srcs`` in batches of ``bsz``: (seconds, outputs), in the system's
    turn (:func:`its_turn`: a CTranslate2 model is loaded before and deleted after, untimed)."""
    with its_turn(decode):
        outs: list[list[int] | None] = [None] * len(srcs)
        t = time.perf_counter()
        for idx in batches(srcs, bsz):
            for i, o in zip(idx, decode([srcs[i] for i in idx], beam, forced)):
                outs[i] = o
        return time.perf_counter() - t, outs


def race(systems: dict[str, Decode], cases: list[tuple], rounds: int, log) -> dict:
    """cases: (key, srcs, batch, beam, forced). Each round runs every case on every system,
    the systems in a rotated order. Returns {key: {system: {"times": [...], "outs": [...]}}}."""
    names = list(systems)
    res = {c[0]: {n: {"times": []} for n in names} for c in cases}
    for r in range(rounds):
        for key, srcs, bsz, beam, forced in cases:
            for n in names[r % len(names):] + names[: r % len(names)]:
                dt, outs = job(systems[n], srcs, bsz, beam, forced)
                res[key][n]["times"].append(dt)
                res[key][n].setdefault("outs", outs)
            log(f"  round {r + 1}/{rounds} {key}: " +
                " ".join(f"{n} {res[key][n]['times'][-1]:.2f}s" for n in names))
    return res


def summarise(cell: dict, ref_outs, forced: int | None) -> dict:
    t = statistics.median(cell["times"])
    outs = cell["outs"]
    if forced:
        outs, ref_outs = [o[:forced] for o in outs], [o[:forced] for o in ref_outs]
        tokens = forced * len(outs)
    else:
        tokens = sum(len(o) for o in outs)
    return {"median_s": t, "tokens_per_s": tokens / t, "sents_per_s": len(outs) / t, "tokens": tokens,
            "differ": sum(a != b for a, b in zip(outs, ref_outs)), "n": len(outs)}


# ---- models and data --------------------------------------------------------------------------
def load_trained(run: Path):
    from transformer.run import load_model

    model, meta = load_model(run)
    return model.float().eval(), Subwords.load(run / "subwords.model"), meta["path"]


def test_set(n: int) -> tuple[list[str], list[str]]:
    pairs = load_multi30k("test_2016_flickr", "en", "de", download=False)[:n]
    return [s for s, _ in pairs], [t for _, t in pairs]


def base_model(vocab_size: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.preset("base", vocab_size=vocab_size, dropout=0.0, max_len=256)).eval()


def synthetic(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab_size, (n, length - 1), generator=g).tolist()  # + EOS = length


# ---- peak memory in child processes ---------------------------------------------------------------
# A CTranslate2 deployment imports neither torch nor this package: its child runs this alone.
CT2_CHILD = """
import json, sys
sys.path.insert(0, %r)
import ctranslate2
from peak_memory import peak_rss_mib
info = json.load(open(sys.argv[1]))
tr = ctranslate2.Translator(info["ct2_dir"], device="cpu", intra_threads=info["threads"],
                            compute_type="float32" if info["system"] == "ct2-fp32" else "int8")
vocab, srcs = info["vocab"], info["srcs"]
order = sorted(range(len(srcs)), key=lambda i: len(srcs[i]))
for k in range(0, len(order), 32):
    tr.translate_batch([[vocab[t] for t in srcs[i]] for i in order[k:k + 32]], beam_size=4,
                       length_penalty=0.0, max_decoding_length=%d)
print(json.dumps({"system": info["system"], "peak_rss_mib": peak_rss_mib()}))
""" % (str(BENCHMARKS), MAX_NEW + 1)


def child(args) -> None:
    """Load one system the way a deployment would and decode; print peak RSS (MiB)."""
    info = json.loads(Path(args.memory_child).read_text())
    name, threads = info["system"], info["threads"]
    srcs = info["srcs"]
    torch.set_num_threads(threads)
    if name == "python+torch":  # the imports alone: this script imports torch and transformer
        decode = None
    else:
        if name == "hf-fp32":
            from transformers import MarianMTModel

            model, _, _ = load_trained(Path(info["run"]))
            decode = hf(model, MarianMTModel.from_pretrained(info["marian_dir"], local_files_only=True))
            del model
        else:
            model, _, _ = load_trained(Path(info["run"]))
            decode = ours(model, name.split("-")[1])
    if decode is not None:
        job(decode, srcs, 32, 4, None)
    print(json.dumps({"system": name, "peak_rss_mib": peak_rss_mib()}))


def memory(run: Path, model, vocab, srcs, workdir: Path, threads: int, log) -> dict[str, float]:
    from transformer.interop import save_marian
    from transformer.interop.ctranslate2 import save_ctranslate2

    ct2_dir, marian_dir = workdir / "mem-ct2", workdir / "mem-marian"
    save_ctranslate2(model, ct2_dir, vocab)
    save_marian(model, marian_dir)
    out = {}
    for name in ("python+torch", *SYSTEMS):
        spec = workdir / f"mem-{name}.json"
        spec.write_text(json.dumps({"system": name, "threads": threads, "srcs": srcs, "run": str(run),
                                    "ct2_dir": str(ct2_dir), "marian_dir": str(marian_dir), "vocab": vocab}))
        argv = ["-c", CT2_CHILD, str(spec)] if name.startswith("ct2") else [__file__, "--memory-child", str(spec)]
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if done.returncode != 0:
            raise RuntimeError(f"memory child {name} failed:\n{done.stderr[-2000:]}")
        out[name] = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]
        log(f"  {name}: peak RSS {out[name]:.0f} MiB")
    return out


# ---- the report ---------------------------------------------------------------------------------
def table(rows: list[tuple[str, dict]], ref: str = "ours-fp32", bleu: dict | None = None) -> str:
    head = "| case | system | tokens/s | sentences/s | x ours-fp32 | x hf-fp32 | differ from ours | BLEU |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for case, cells in rows:
        base = cells[ref]["tokens_per_s"]
        hf_base = cells["hf-fp32"]["tokens_per_s"] if "hf-fp32" in cells else float("nan")
        for name, c in cells.items():
            b = "" if not bleu or name not in bleu.get(case, {}) else f"{bleu[case][name]:.2f}"
            lines.append(f"| {case} | {name} | {c['tokens_per_s']:,.0f} | {c['sents_per_s']:.1f} | "
                         f"{c['tokens_per_s'] / base:.2f} | {c['tokens_per_s'] / hf_base:.2f} | "
                         f"{c['differ']}/{c['n']} | {b} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="runs/demo", help="trained run directory (part A, M)")
    ap.add_argument("--n", type=int, default=64, help="test sentences for part A")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads for every system (1: on a shared 2-core machine two threads "
                         "spend more time handing work over than computing)")
    ap.add_argument("--parts", default="A,B,C,Q,M")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default=None, help="write every figure as JSON here")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        return child(args)

    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    parts = set(args.parts.split(","))
    names = [s for s in args.systems.split(",") if s]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    workdir = Path(tempfile.mkdtemp(prefix="decode-bench-"))
    run = Path(args.run)
    model, subwords, weights = load_trained(run)
    vocab = subwords.vocab()
    sources, refs = test_set(args.n)
    srcs = [subwords.encode(s) for s in sources]
    report = {"weights": weights, "n": args.n, "rounds": args.rounds, "threads": args.threads,
              "torch": torch.__version__, "params": model.num_parameters(), "machine": hardware.describe()}
    print(f"# Decoding benchmark\n\nmodel {weights} ({model.num_parameters() / 1e6:.1f}M parameters), "
          f"{args.threads} threads, {args.rounds} rounds (medians), torch {torch.__version__}\n")

    if "A" in parts:
        log("part A: trained model, test sentences")
        systems = build(model, vocab, workdir, args.threads, names)
        cases = [(f"beam{k} b{b}", srcs, b, k, None) for k in (4, 1) for b in (1, 32)]
        res = race(systems, cases, args.rounds, log)
        rows, bleu = [], {}
        for key, *_ in cases:
            ref_key = key.replace("b32", "b1")
            cells = {n: summarise(res[key][n], res[ref_key]["ours-fp32"]["outs"], None) for n in names}
            rows.append((key, cells))
            bleu[key] = {n: score([subwords.decode(o) for o in res[key][n]["outs"]], refs).bleu for n in names}
        report["A"] = {"rows": rows, "bleu": bleu}
        print(f"## A. Trained model, first {args.n} test_2016_flickr en->de sentences (outputs compared with "
              "ours-fp32 at batch 1 of the same search; BLEU: sacreBLEU, cased, on these sentences)\n")
        print(table(rows, bleu=bleu) + "\n")

    if "B" in parts:
        log("part B: time against sentence length")
        systems = build(model, vocab, workdir, args.threads, names)
        cases = [(f"len{n}", synthetic(32, n, model.cfg.vocab_size, n), 32, 4, n) for n in (10, 20, 40, 80)]
        res = race(systems, cases, args.rounds + 2, log)  # short cases: more rounds against noise
        rows = [(key, {n: summarise(res[key][n], res[key]["ours-fp32"]["outs"], forced) for n in names})
                for key, _, _, _, forced in cases]
        report["B"] = rows
        print(f"## B. Time against length: 32 synthetic sources of L subwords, L target tokens forced, "
              f"beam 4, batch 32, {args.rounds + 2} rounds (ms per sentence)\n")
        print("Outputs differ here for reasons other than arithmetic: on random sources the model's "
              "choices are near ties, and the forced end is scored differently (HF gives the forced EOS "
              "log-prob 0, ours its real log-prob; CTranslate2 blocks EOS before its softmax, which "
              "renormalises).\n")
        print("| system | " + " | ".join(k for k, _ in rows) + " | len80 / len10 |")
        print("|---|" + "---|" * (len(rows) + 1))
        for n in names:
            ms = [1000 * cells[n]["median_s"] / cells[n]["n"] for _, cells in rows]
            print(f"| {n} | " + " | ".join(f"{m:.1f}" for m in ms) + f" | {ms[-1] / ms[0]:.1f}x |")
        print()
        print(table(rows) + "\n")

    if "C" in parts:
        log("part C: paper base model, random weights")
        base = base_model(model.cfg.vocab_size)
        systems = build(base, vocab, workdir, args.threads, names)
        base_srcs = srcs[:64] if len(srcs) >= 64 else (srcs * 64)[:64]
        res = race(systems, [("base beam4 b32", base_srcs, 32, 4, 20)], args.rounds, log)
        rows = [("base beam4 b32", {n: summarise(res["base beam4 b32"][n], res["base beam4 b32"]["ours-fp32"]["outs"],
                                                 20) for n in names})]
        report["C"] = {"rows": rows, "params": base.num_parameters()}
        print(f"## C. Paper base model (6+6, d_model 512, {base.num_parameters() / 1e6:.1f}M parameters, random "
              "weights), 64 test sentences, 20 target tokens forced, beam 4, batch 32\n")
        print(table(rows) + "\n")
        del systems, base

    if "Q" in parts:
        log("part Q: quality on the whole test set")
        all_sources, all_refs = test_set(10**6)
        all_srcs = [subwords.encode(x) for x in all_sources]
        systems = build(model, vocab, workdir, args.threads, names)
        rows = []
        report["Q"] = {}
        for beam in (4, 1):
            outs = {n: job(systems[n], all_srcs, 32, beam, None)[1] for n in names}
            ref = outs["ours-fp32"]
            for n in names:
                bleu = score([subwords.decode(o) for o in outs[n]], all_refs)
                differ = sum(a != b for a, b in zip(outs[n], ref))
                rows.append((beam, n, bleu.bleu, bleu.bleu_lc, differ, len(ref)))
                report["Q"][f"beam{beam} {n}"] = {"bleu": bleu.bleu, "bleu_lc": bleu.bleu_lc, "differ": differ}
        print(f"## Q. Quality: the whole test_2016_flickr en->de set ({len(all_srcs)} sentences), batch 32, "
              "alpha / length_penalty 0\n")
        print("| search | system | BLEU | lower-cased BLEU | outputs differing from ours-fp32 |\n|---|---|---|---|---|")
        for beam, n, b, lc, d, total in rows:
            print(f"| {'beam 4' if beam == 4 else 'greedy'} | {n} | {b:.2f} | {lc:.2f} | {d}/{total} |")
        print()
        del systems

    if "M" in parts:
        log("part M: peak memory")
        mem = memory(run, model, vocab, srcs, workdir, args.threads, log)
        report["M"] = mem
        print("## M. Peak memory: a fresh process per system (its own imports only), decoding part A's "
              "sentences at beam 4, batch 32; peak RSS = VmHWM of /proc/self/status\n")
        print("| system | peak RSS (MiB) |\n|---|---|")
        for n, m in mem.items():
            print(f"| {n} | {m:.0f} |")
        print()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
