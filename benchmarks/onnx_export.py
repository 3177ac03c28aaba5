"""The ONNX exporters side by side: torch's TorchScript-based one (``dynamo=False``, what
``transformer.interop.onnx`` used before 2026-12-02, opset 17) and the ``torch.export``-based
one it uses now (``dynamo=True``, opset 18), on the same model and the same inputs.

For each: the export time (both exporters warmed up on a tiny model first), the largest
|difference| from the model (``check_onnx``: encoder output, one-step logits after 0, 1 and 7
earlier positions, the grown cache), and ONNX Runtime greedy decoding (``greedy_onnx``) of
the same sources, batch 1 and 32, the two graph pairs taking turns round after round; median
sentences/s. The outputs of both are compared with ``greedy_search`` on the model.

Model: the paper's base model (6+6, d_model 512) with random weights and random sources of
8 to 30 subwords, or the trained model of ``--run`` (its sources are random too).

    .venv/bin/python -W ignore benchmarks/onnx_export.py [--run RUN_DIR] [--n 64] [--rounds 3] [--threads 1]

(``-W ignore``: the old exporter's TracerWarnings and its DeprecationWarning.)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from transformer import ModelConfig, Transformer, hardware
from transformer.decode import greedy_search, pad_batch
from transformer.interop import onnx as ox


def export_legacy(model: Transformer, out_dir: Path) -> None:
    """The TorchScript export as ``transformer.interop.onnx`` did it before (same graphs and names)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    src, tokens, src_mask, cross, past = ox._example_inputs(model)
    n = model.cfg.n_layers
    cross_names, past_names, present_names = (ox._kv_names(p, n) for p in ("cross", "past", "present"))
    enc_axes = {"src": {0: "batch", 1: "src_len"}, "memory": {0: "batch", 1: "src_len"},
                **{name: {0: "batch", 2: "src_len"} for name in cross_names}}
    torch.onnx.export(ox._EncoderGraph(model), (src,), str(out_dir / ox.ENCODER), dynamo=False, opset_version=17,
                      input_names=["src"], output_names=["memory", *cross_names], dynamic_axes=enc_axes)
    dec_axes = {"tokens": {0: "batch"}, "src_mask": {0: "batch", 1: "src_len"}, "logits": {0: "batch"},
                **{name: {0: "batch", 2: "src_len"} for name in cross_names},
                **{name: {0: "batch", 2: "past_len"} for name in past_names},
                **{name: {0: "batch", 2: "total_len"} for name in present_names}}
    torch.onnx.export(ox._DecoderStepGraph(model), (tokens, src_mask, *cross, *past), str(out_dir / ox.DECODER),
                      dynamo=False, opset_version=17, input_names=["tokens", "src_mask", *cross_names, *past_names],
                      output_names=["logits", *present_names], dynamic_axes=dec_axes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run directory (default: the base model, random weights)")
    ap.add_argument("--n", type=int, default=64, help="source sentences")
    ap.add_argument("--max-len", type=int, default=40, help="target tokens at most")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    if args.run:
        from transformer.run import load_model

        model = load_model(Path(args.run))[0].float().eval()
    else:
        torch.manual_seed(0)
        model = Transformer(ModelConfig.preset("base", vocab_size=10000, dropout=0.0, max_len=256)).eval()
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randint(4, cfg.vocab_size, (int(torch.randint(8, 31, (), generator=g)),), generator=g).tolist()
            + [cfg.eos_id] for _ in range(args.n)]
    work = Path(tempfile.mkdtemp(prefix="onnx_export_"))
    exporters = {"TorchScript (dynamo=False), opset 17": export_legacy,
                 "torch.export (dynamo=True), opset 18": ox.export_onnx}
    tiny = Transformer(ModelConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32)).eval()
    rows = {}
    for name, export in exporters.items():
        export(tiny, work / "warmup")
        out = work / name.split()[0]
        t0 = time.perf_counter()
        export(model, out)
        rows[name] = {"dir": out, "export_s": time.perf_counter() - t0}
    new_dir = rows[next(reversed(rows))]["dir"]
    for row in rows.values():
        if row["dir"] != new_dir:
            shutil.copy(new_dir / "onnx_config.json", row["dir"])  # greedy_onnx reads the config there
        row["diffs"] = ox.check_onnx(model, row["dir"], pad_batch(srcs[:16], cfg.pad_id), past_lengths=(0, 1, 7))
        row["sessions"] = ox._sessions(row["dir"])

    with torch.inference_mode():
        ours = {b: [h[0].tokens for i in range(0, len(srcs), b) for h in
                    greedy_search(model, pad_batch(srcs[i:i + b], cfg.pad_id), max_len_a=0.0, max_len_b=args.max_len)]
                for b in (1, 32)}
    for batch in (1, 32):
        times = {name: [] for name in rows}
        for r in range(args.rounds):
            for name in list(rows)[r % 2:] + list(rows)[:r % 2]:  # alternate who goes first
                t0 = time.perf_counter()
                outs = [h for i in range(0, len(srcs), batch) for h in
                        ox.greedy_onnx(rows[name]["dir"], pad_batch(srcs[i:i + batch], cfg.pad_id), args.max_len,
                                       rows[name]["sessions"])]
                times[name].append(time.perf_counter() - t0)
                rows[name][f"same_{batch}"] = sum(a == b for a, b in zip(outs, ours[batch]))
        for name in rows:
            rows[name][f"sps_{batch}"] = len(srcs) / statistics.median(times[name])

    print(f"{cfg.n_layers}+{cfg.n_layers} layers, d_model {cfg.d_model}, vocabulary {cfg.vocab_size}, "
          f"{model.num_parameters() / 1e6:.1f}M parameters; {args.n} sources, greedy, at most {args.max_len} "
          f"tokens, {args.threads} thread(s), median of {args.rounds} rounds\n")
    print("| exporter | export s | max abs diff: memory / logits / present | greedy b1 sent/s | greedy b32 sent/s "
          "| outputs = greedy_search (b1, b32) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        d = r["diffs"]
        print(f"| {name} | {r['export_s']:.1f} | {d['memory']:.1e} / {d['logits']:.1e} / {d['present']:.1e} | "
              f"{r['sps_1']:.1f} | {r['sps_32']:.1f} | {r['same_1']}, {r['same_32']} of {args.n} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
