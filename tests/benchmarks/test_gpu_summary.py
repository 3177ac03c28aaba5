"""benchmarks/gpu/summary.py reads what benchmarks/gpu/check.sh leaves behind (run on a GPU only
by sessions that have one) and states each figure against its goal: held here to files of the
shapes the check writes, so that a GPU's one run is not lost to a parsing slip."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
from summary import rows  # noqa: E402


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_each_figure_is_read_from_the_files_the_check_writes(tmp_path):
    (tmp_path / "pytest.log").write_text("...\n13 passed in 41.2s\npytest rc=0\n")
    write_jsonl(tmp_path / "demo_metrics.jsonl", [{"step": 1500, "loss": 2.0, "tgt_tokens_per_s": 1e6},
                                                  {"event": "stop", "step": 1500, "train_minutes": 0.45}])
    for prec, secs, wall in (("default", 0.4, 5.5), ("fp32", 0.6, 6.1)):
        (tmp_path / f"eval_{prec}.json").write_text(json.dumps({"bleu": 32.7, "seconds": secs, "precision": "bf16"}))
        (tmp_path / f"eval_{prec}.wall").write_text(f"{wall}\n")
    (tmp_path / "gpu_base.json").write_text(json.dumps({"batch": 1000, "length": 25, "vocab": 37000,
                                                        "mfu_vs_measured": 0.31, "ours_vs_torch_nn": 1.6}))
    for mode, ms in (("eager", 12.0), ("compiled", 10.0)):  # nanoGPT: the first time line is left out
        write_jsonl(tmp_path / f"lm_{mode}.jsonl", [{"step": s, "tgt_tokens_per_s": t} for s, t in
                                                    ((10, 1.0), (20, 1.5e6), (30, 1.7e6))] + [{"event": "eval", "valid_nll": 1.51}])
        (tmp_path / f"ng_{mode}.log").write_text("iter 0: loss 4.2, time 9000.00ms\n" +
                                                 "".join(f"iter {i}: loss 2.0, time {ms:.2f}ms, mfu 1%\n" for i in (10, 20)))
        (tmp_path / f"ng_{mode}.val").write_text("number of parameters: 10.65M\n1.53\n")
    write_jsonl(tmp_path / "lm_full.jsonl", [{"event": "eval", "valid_nll": 1.46}, {"event": "stop", "step": 5000}])
    got = {what: measured for what, measured, _ in rows(tmp_path, tokens=16384)}
    assert got["CUDA-only tests (tests/gpu)"] == "13 passed in 41.2s"
    assert got["demo recipe: training minutes"] == "0.45"
    assert got["evaluate test2016 beam 4, default precision: decoding seconds"] == "0.40 (bf16)"
    assert got["the same command: wall seconds"] == "5.5" and got["the same in fp32: decoding seconds"] == "0.60"
    assert got["base model, paper's batch (1000 x 25 tokens, vocab 37000): MFU of the measured matmul rate"] == "31.0%"
    # ours 1.6M tokens/s (the median of the records after the first), nanoGPT 16,384 tokens / 12 ms
    assert got["language model, eager: ours / nanoGPT tokens/s"] == f"{1.6e6 / (16384 / 0.012):.2f}x"
    assert got["language model, compiled: ours / nanoGPT tokens/s"] == f"{1.6e6 / (16384 / 0.010):.2f}x"
    assert got["the same: exact validation loss, ours / nanoGPT"] == "1.5100 / 1.5300"
    assert got["language model recipe, 5000 updates: exact validation loss"] == "1.4600"


def test_a_step_that_did_not_run_says_so(tmp_path):
    got = [measured for _, measured, _ in rows(tmp_path, tokens=16384)]
    assert len(got) == 14 and all("not run" in v for v in got), got
