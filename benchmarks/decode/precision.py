"""Decoding precision through the user's path: ``Translator`` (what ``transformer translate`` /
``evaluate --precision P`` run) at fp32, bf16 and int8 on the whole Multi30k test set.

For each precision: sentences/s and target tokens/s over the test set (sorted by length,
batches of ``--max-tokens`` source tokens, as the command line does), the ratio to fp32, the
BLEU of the output (sacreBLEU cased / lower-cased / tokenised lower-cased, as in the README)
and how many outputs differ from fp32. The precisions take turns round after round in one
process (the order rotates), and times are medians over rounds: read the ratios. The ratio
of best rounds (each precision's fastest against fp32's) is printed too: other load on a
shared machine only ever slows a round down.

``int8-ao`` (only when listed in ``--precisions``) is the int8 path that ``--precision int8``
ran until 2026-12-02, ``torch.ao`` dynamic quantisation (deprecated in torch), kept here
alone, in :func:`int8_ao`, for comparison.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/decode/precision.py \\
        --run runs/multi30k-en-de [--beam 5 --alpha 1.0] [--rounds 3] [--threads 2] [--n 1000] \\
        [--precisions fp32,bf16,int8,int8-ao]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import yaml
from torch import nn

from transformer import hardware
from transformer.data import load_multi30k
from transformer.decode.precision import PRECISIONS
from transformer.evaluation.translation import score
from transformer.inference.translator import load_translator


def int8_ao(model: nn.Module) -> nn.Module:
    """The old ``for_inference(model, "int8")``: a float32 copy (a tied model's output
    projection made a layer of its own) with every ``nn.Linear`` dynamically quantised by
    ``torch.ao`` (int8 weights, one scale per output row; activations quantised per call)."""
    out = copy.deepcopy(model).float().eval()
    if out.out_proj is None:
        weight = out.tgt_embed.weight.detach()
        out.out_proj = nn.utils.skip_init(nn.Linear, out.cfg.d_model, weight.size(0), bias=False)
        out.out_proj.weight = nn.Parameter(weight.clone(), requires_grad=False)
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao's eager quantisation warns that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
        return torch.ao.quantization.quantize_dynamic(out, {nn.Linear: qconfig}, dtype=torch.qint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (the command line's default: all)")
    ap.add_argument("--n", type=int, default=1000, help="test sentences")
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    names = args.precisions.split(",")
    run_cfg = yaml.safe_load((Path(args.run) / "config.yaml").read_text())
    src_lang, tgt_lang = run_cfg["src_lang"], run_cfg["tgt_lang"]
    pairs = load_multi30k("test_2016_flickr", src_lang, tgt_lang, download=False)[: args.n]
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    tr = {p: load_translator(args.run, beam=args.beam, alpha=args.alpha, max_tokens=args.max_tokens,
                             precision="fp32" if p == "int8-ao" else p) for p in names}
    for p in names:
        if p == "int8-ao":
            tr[p].model = int8_ao(tr[p].model)
    times: dict[str, list[float]] = {p: [] for p in names}
    outs: dict[str, list] = {}
    for r in range(args.rounds):
        for p in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            res = tr[p].translate_nbest(sources)
            times[p].append(time.perf_counter() - t)
            outs.setdefault(p, res)
        print(f"round {r + 1}: " + " ".join(f"{p} {times[p][-1]:.1f}s" for p in names), file=sys.stderr, flush=True)
    base, base_best = statistics.median(times[names[0]]), min(times[names[0]])
    print(f"{args.run} ({src_lang}->{tgt_lang}), {len(sources)} test sentences, beam {args.beam}, alpha {args.alpha}, "
          f"{args.threads} threads, {args.rounds} rounds (medians), torch {torch.__version__}\n")
    print(f"| precision | sentences/s | target tokens/s | x {names[0]} | x {names[0]}, best rounds | BLEU | lower-cased | "
          f"tokenised lc | outputs differing from {names[0]} |\n|---|---|---|---|---|---|---|---|---|")
    for p in names:
        t = statistics.median(times[p])
        hyps = [r[0].text for r in outs[p]]
        tokens = sum(len(r[0].tokens) for r in outs[p])
        s = score(hyps, refs, tgt_lang)
        differ = sum(a[0].tokens != b[0].tokens for a, b in zip(outs[p], outs[names[0]]))
        print(f"| {p} | {len(sources) / t:.1f} | {tokens / t:,.0f} | {base / t:.2f} | {base_best / min(times[p]):.2f} | "
              f"{s.bleu:.2f} | "
              f"{s.bleu_lc:.2f} | {s.bleu_tok_lc:.2f} | {differ}/{len(sources)} |")


if __name__ == "__main__":
    main()
