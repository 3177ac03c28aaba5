"""benchmarks/decode/real_size.py, real_size_split.py and benchmarks/lm/qwen_size.py run end to
end at tiny sizes: every system decodes the same work and lands in the table; the work folder is
reused, and one of another shape is refused in one line; the split finds every part's operators."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARIAN = REPO / "benchmarks" / "decode" / "real_size.py"
SPLIT = REPO / "benchmarks" / "decode" / "real_size_split.py"
QWEN = REPO / "benchmarks" / "lm" / "qwen_size.py"
TINY = ["--n", "3", "--rounds", "1", "--threads", "1", "--d-model", "32", "--layers", "1", "--heads", "2",
        "--ffn", "64", "--vocab", "1200", "--spm-vocab", "300", "--train-lines", "500", "--max-length", "7",
        "--matmul-sizes", "64"]
SYSTEMS = ["ours-auto", "ours-int8", "ours-fp32", "ct2-int8", "ct2-float32", "hf-fp32"]


def env() -> dict:
    data = os.environ.get("TRANSFORMER_DATA", str(REPO.parent / "shared" / "data"))
    if not (Path(data) / "multi30k" / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {data} (set TRANSFORMER_DATA)")
    return {**os.environ, "TRANSFORMER_DATA": data, "OMP_NUM_THREADS": "1"}


def run(script: Path, *args: str, environ=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", str(script), *args], capture_output=True, text=True,
                          timeout=600, env=environ or env(), cwd=REPO)


def test_marian_every_system_same_work_and_reused_folder(tmp_path):
    pytest.importorskip("ctranslate2")
    environ = env()
    work, out = tmp_path / "work", tmp_path / "r.json"
    r = run(MARIAN, "--work", str(work), *TINY, "--json", str(out), environ=environ)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("machine: ")
    res = json.loads(out.read_text())
    assert list(res["systems"]) == SYSTEMS and res["machine"]["cpu"]
    # EOS never wins: each of the 3 sentences runs max_length - 1 = 6 decoder steps in every system
    assert {c["decoder_steps"] for c in res["systems"].values()} == {3 * 6}
    assert len({json.dumps(c["multiply_adds"]) for c in res["systems"].values()}) == 1
    assert res["systems"]["ours-fp32"]["same_as_ours_fp32"] == 3
    assert all(c["median_s"] > 0 and c["mac_per_s"] > 0 for c in res["systems"].values())
    for label in ("CTranslate2 int8", "CTranslate2 float32", "HF generate() fp32", "ours --precision fp32"):
        assert f"| {label} |" in r.stdout
    assert "ours fp32 / CT2 float32:" in r.stdout and "load average" in r.stdout
    vocab = json.loads((work / "hf" / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 1200 and vocab["</s>"] == 0 and vocab["<pad>"] == 1199
    assert {"best.safetensors", "config.yaml", "source.spm", "vocab.json"} <= {p.name for p in (work / "run").iterdir()}

    split = run(SPLIT, "--work", str(work), "--n", "2", "--precisions", "fp32", "--threads", "1",
                "--json", str(tmp_path / "s.json"), environ=environ)
    assert split.returncode == 0, split.stderr[-2000:]
    parts = json.loads((tmp_path / "s.json").read_text())["precisions"]["fp32"]["parts_ms"]
    for part in ("output projection", "self-attention: projections", "cross-attention: projections", "FFN",
                 "encoder, and the memory's keys and values", "beam search (outside the model's step)"):
        assert parts[part] > 0, part

    stamp = (work / "hf" / "model.safetensors").stat().st_mtime_ns
    again = run(MARIAN, "--work", str(work), *TINY, "--systems", "ours-fp32", environ=environ)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "building" not in again.stderr and (work / "hf" / "model.safetensors").stat().st_mtime_ns == stamp

    other = run(MARIAN, "--work", str(work), *TINY, "--d-model", "64", environ=environ)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert other.stderr.strip().count("\n") == 0 and "another shape" in other.stderr and "d_model 32" in other.stderr


def test_marian_refuses_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = run(MARIAN, "--work", str(tmp_path), *TINY)
    assert r.returncode == 2 and "not empty" in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    split = run(SPLIT, "--work", str(tmp_path))
    assert split.returncode == 2 and "no run/" in split.stderr and "Traceback" not in split.stderr


def test_qwen_shaped_reports_every_system_at_each_batch(tmp_path):
    out = tmp_path / "q.json"
    r = run(QWEN, "--batches", "1,2", "--new", "5", "--prompt", "3", "--rounds", "1", "--threads", "1",
            "--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "64", "--vocab", "300",
            "--matmul-sizes", "64",
            "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {(row["batch"], row["system"]): row for row in res["rows"]}
    assert set(rows) == {(b, s) for b in (1, 2) for s in ("ours-auto", "ours-int8", "ours-fp32", "hf-fp32")}
    assert all(row["all_new_tokens"] and row["median_s"] > 0 for row in rows.values())
    assert rows[(2, "ours-fp32")]["same_as_ours_fp32"] == 2 and rows[(2, "hf-fp32")]["same_as_ours_fp32"] in (0, 1, 2)
    assert "batch 8" not in r.stdout and "batch 2: ours at its fastest" in r.stdout
