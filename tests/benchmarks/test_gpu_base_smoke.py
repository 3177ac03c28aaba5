"""benchmarks/gpu_base.py is run on a GPU only by sessions that have one: keep it working
by running it on the CPU with tiny settings. At fp32 everywhere (the benchmark's logic, fast
on any CPU); at bf16 too where the CPU computes it natively (AMX / AVX512-BF16): elsewhere
torch emulates bf16, about 20x slower than fp32."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer.hardware import cpu_has_native_bf16

REPO = Path(__file__).resolve().parents[2]
PRECISIONS = ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(
    not cpu_has_native_bf16(), reason="this CPU emulates bf16 (no AMX / AVX512-BF16 kernels in torch)"))]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gpu_base_benchmark_runs_on_cpu(tmp_path, precision):
    data = os.environ.get("TRANSFORMER_DATA", str(REPO.parent / "shared" / "data"))
    if not (Path(data) / "multi30k" / "test_2016_flickr.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {data} (set TRANSFORMER_DATA)")
    out = tmp_path / "gpu.json"
    env = {**os.environ, "TRANSFORMER_DATA": data, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_base.py"), "--device", "cpu", "--steps", "2",
                        "--batch", "8", "--decode", "8", "--precision", precision, "--json", str(out), "--peer"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("machine: ")
    figures = json.loads(out.read_text())
    assert figures["precision"] == precision
    assert figures["machine"]["capability"] and "native_bf16" in figures["machine"]
    assert 45 < figures["params_M"] < 53  # base layers with a 10k (not 37k) vocabulary: 49.3 M
    assert figures["updates"] == 2 and figures["train_tgt_tokens_per_s"] > 0
    assert 0 < figures["mfu_vs_measured"] < 2
    assert figures["decode_beam4_sentences_per_s"] > 0 and figures["decode_greedy_tokens_per_s"] > 0
    assert figures["peer_tgt_tokens_per_s"] > 0 and figures["ours_vs_torch_nn"] > 0  # torch.nn.Transformer, same shape

