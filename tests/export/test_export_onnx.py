"""ONNX export: onnxruntime reproduces the encoder output and the one-step logits (with the
KV cache fed in and out) within 1e-4, for every model option; greedy decoding on the
graphs gives our tokens."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from export_models import VARIANTS, random_model, random_sources  # noqa: E402
from transformer.data import Subwords  # noqa: E402
from transformer.decode import greedy_search, pad_batch  # noqa: E402
from transformer.interop.onnx import check_onnx, export_onnx, greedy_onnx  # noqa: E402
from transformer.run import load_model  # noqa: E402

TOL = 1e-4


@pytest.mark.parametrize("variant", ["post-norm-interleaved", "pre-norm", "swiglu", "untied-bias-gelu"])
def test_graphs_reproduce_the_model(variant, tmp_path):
    model = random_model(**VARIANTS[variant])
    export_onnx(model, tmp_path)
    src = pad_batch([s + [2] for s in random_sources()], 0)  # padded rows, lengths 4 .. 13
    diffs = check_onnx(model, tmp_path, src, past_lengths=(0, 1, 7))
    print(f"{variant}: {diffs}")
    assert max(diffs.values()) < TOL


def test_graph_inputs_and_outputs_are_named_and_dynamic(tmp_path):
    import onnx

    export_onnx(random_model(), tmp_path)
    info = json.loads((tmp_path / "onnx_config.json").read_text(encoding="utf-8"))
    dec = onnx.load(str(tmp_path / "decoder_step.onnx"))
    assert [i.name for i in dec.graph.input] == info["decoder_step"]["inputs"]
    assert info["decoder_step"]["inputs"][:4] == ["tokens", "src_mask", "cross_k_0", "cross_v_0"]
    assert "past_k_1" in info["decoder_step"]["inputs"] and "present_v_1" in info["decoder_step"]["outputs"]
    past = next(i for i in dec.graph.input if i.name == "past_k_0").type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in past] == ["batch", 4, "past_len", 8]


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from transformer.cli import main

    out = tmp_path_factory.mktemp("onnx") / "model"
    assert main(["export", "--model", str(trained.run), "--format", "onnx", "--out", str(out)]) == 0
    return out


def test_cli_export_checks_and_decodes_like_ours(exported, trained):
    assert {"encoder.onnx", "decoder_step.onnx", "onnx_config.json", "subwords.model", "README.txt"} <= \
        {p.name for p in exported.iterdir()}
    model, _ = load_model(trained.run)
    subwords = Subwords.load(exported / "subwords.model")
    src = pad_batch([subwords.encode(s) + [model.cfg.eos_id] for s in trained.sources(12)], model.cfg.pad_id)
    assert max(check_onnx(model, exported, src).values()) < TOL
    ours = [h[0].tokens for h in greedy_search(model, src, max_len_a=0.0, max_len_b=40)]
    assert greedy_onnx(exported, src, max_len=40) == ours


def test_export_leaves_a_bf16_model_alone(tmp_path):
    model = random_model().to(torch.bfloat16)
    export_onnx(model, tmp_path)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert max(check_onnx(model.float(), tmp_path).values()) < TOL
