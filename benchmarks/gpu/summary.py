"""The GPU check's figures against the GPU goals, as one Markdown table.

    python benchmarks/gpu/summary.py OUT_DIR [--tokens-per-update 16384]

Reads what benchmarks/gpu/check.sh left in OUT_DIR (pytest.log, demo_metrics.jsonl,
eval_*.json / *.wall, gpu_base.json, gpu_base_compile.json, lm_*.jsonl, ng_*.log / *.val, lm_full.jsonl); a step that
did not run shows as "not run".
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

NOT_RUN = "not run"


def records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def ours_tokens_per_s(path: Path) -> float | None:
    """The median of the training records' tokens/s, the first (start-up, compilation) left out."""
    train = [r["tgt_tokens_per_s"] for r in records(path) if "event" not in r and "tgt_tokens_per_s" in r]
    return statistics.median(train[1:]) if len(train) > 1 else None


def last_valid(path: Path) -> float | None:
    evals = [r["valid_nll"] for r in records(path) if "valid_nll" in r]
    return evals[-1] if evals else None


def nanogpt_tokens_per_s(log: Path, tokens: int) -> float | None:
    """nanoGPT's median "time ...ms" of its iteration lines (the first left out), as tokens/s."""
    if not log.is_file():
        return None
    ms = [float(x) for x in re.findall(r"time ([0-9.]+)ms", log.read_text(encoding="utf-8"))][1:]
    return tokens / statistics.median(ms) * 1e3 if ms else None


def number(path: Path) -> float | None:
    try:
        return float(path.read_text(encoding="utf-8").split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def fmt(x, spec: str = ".3g") -> str:
    return NOT_RUN if x is None else format(x, spec)


def ratio(a, b) -> str:
    return NOT_RUN if a is None or b is None else f"{a / b:.2f}x"


def rows(out: Path, tokens: int) -> list[tuple[str, str, str]]:
    res = []
    log = out / "pytest.log"
    if log.is_file():
        text = log.read_text(encoding="utf-8")
        tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
        res.append(("CUDA-only tests (tests/gpu)", tail[-1].strip("= ") if tail else "no summary", "all pass, none skipped"))
    else:
        res.append(("CUDA-only tests (tests/gpu)", NOT_RUN, "all pass, none skipped"))
    stop = [r for r in records(out / "demo_metrics.jsonl") if r.get("event") == "stop"]
    res.append(("demo recipe: training minutes", fmt(stop[-1]["train_minutes"], ".2f") if stop else NOT_RUN,
                f"<= 0.5 for {stop[-1]['step'] if stop else 1500} updates"))
    evals = {}
    for prec in ("default", "fp32"):
        path = out / f"eval_{prec}.json"
        evals[prec] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and path.stat().st_size else None
    d, f = evals["default"], evals["fp32"]
    res.append(("demo model: test2016 BLEU, beam 4, default precision", fmt(d and d.get("bleu"), ".2f"),
                "within 0.5 of the CPU's (benchmarks/multi30k.md)"))
    res.append(("evaluate test2016 beam 4, default precision: decoding seconds",
                fmt(d and d.get("seconds"), ".2f") + (f" ({d['precision']})" if d else ""), "<= 0.5"))
    res.append(("the same command: wall seconds", fmt(number(out / "eval_default.wall"), ".1f"), "< 6"))
    res.append(("the same in fp32: decoding seconds", fmt(f and f.get("seconds"), ".2f"), "default <= fp32"))
    base = json.loads((out / "gpu_base.json").read_text()) if (out / "gpu_base.json").is_file() else {}
    shape = f"{base.get('batch')} x {base.get('length')} tokens, vocab {base.get('vocab')}" if base else ""
    res.append((f"base model, paper's batch ({shape}): MFU of the measured matmul rate",
                fmt(base.get("mfu_vs_measured"), ".1%"), ">= 30%"))
    res.append(("the same: ours / torch.nn.Transformer tokens/s", fmt(base.get("ours_vs_torch_nn"), ".2f"), ">= 1.5x"))
    compiled = json.loads((out / "gpu_base_compile.json").read_text()) if (out / "gpu_base_compile.json").is_file() else {}
    res.append(("the same, its training graph compiled at that one shape / eager (step compile)",
                fmt(compiled.get("compiled_vs_eager"), ".2f"), "> 1 for bucketed compile to be worth building"))
    for mode, goal in (("eager", ">= 1.1x"), ("compiled", ">= 1.3x")):
        ours, peer = ours_tokens_per_s(out / f"lm_{mode}.jsonl"), nanogpt_tokens_per_s(out / f"ng_{mode}.log", tokens)
        res.append((f"language model, {mode}: ours / nanoGPT tokens/s", ratio(ours, peer), goal))
        res.append((f"the same: exact validation loss, ours / nanoGPT",
                    f"{fmt(last_valid(out / f'lm_{mode}.jsonl'), '.4f')} / {fmt(number(out / f'ng_{mode}.val'), '.4f')}",
                    "ours no worse"))
    full = records(out / "lm_full.jsonl")
    stop = [r for r in full if r.get("event") == "stop"]
    res.append((f"language model recipe, {stop[-1]['step'] if stop else 5000} updates: exact validation loss",
                fmt(last_valid(out / "lm_full.jsonl"), ".4f"), "<= 1.47 (nanoGPT's README: 1.4697)"))
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens-per-update", type=int, default=16384, help="nanoGPT's batch x context")
    args = ap.parse_args(argv)
    import torch

    from transformer import hardware

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"machine: {gpu}; {hardware.describe_line()}")
    print("| figure | measured | goal |\n|---|---|---|")
    for what, got, goal in rows(args.out, args.tokens_per_update):
        print(f"| {what} | {got} | {goal} |")


if __name__ == "__main__":
    main()
