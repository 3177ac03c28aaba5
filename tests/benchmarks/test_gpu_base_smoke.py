"""benchmarks/gpu_base.py is run on a GPU only by sessions that have one: keep it working
by running it on the CPU with tiny settings."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_base_benchmark_runs_on_cpu(tmp_path):
    data = os.environ.get("TRANSFORMER_DATA", str(REPO.parent / "shared" / "data"))
    if not (Path(data) / "multi30k" / "test_2016_flickr.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {data} (set TRANSFORMER_DATA)")
    out = tmp_path / "gpu.json"
    env = {**os.environ, "TRANSFORMER_DATA": data, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_base.py"), "--device", "cpu", "--steps", "2",
                        "--batch", "8", "--decode", "8", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    figures = json.loads(out.read_text())
    assert 45 < figures["params_M"] < 53  # base layers with a 10k (not 37k) vocabulary: 49.3 M
    assert figures["updates"] == 2 and figures["train_tgt_tokens_per_s"] > 0
    assert 0 < figures["mfu_vs_measured"] < 2
    assert figures["decode_beam4_sentences_per_s"] > 0 and figures["decode_greedy_tokens_per_s"] > 0
