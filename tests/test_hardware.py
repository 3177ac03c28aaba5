"""What precision ``auto`` becomes on each CPU family, with the CPU's flags faked: bf16 only
where it is native (AVX512-BF16 or AMX with torch on its AVX-512 kernels), fp32 on an
AVX2-only CPU; an explicit bf16 where it is emulated still runs, with one line saying so;
int8 multiplies in what the CPU is fast at."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from transformer import hardware
from transformer.decode.decoding_config import DecodingConfig
from transformer.decode import choose
from transformer.decode.int8 import Int8Linear
from transformer.decode.precision import decoding_model, for_inference

AMX = frozenset("fpu sse avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8".split())
AVX512_NO_BF16 = frozenset("fpu sse avx avx2 fma avx512f avx512bw avx512_vnni".split())
AVX2 = frozenset("fpu sse avx avx2 fma".split())
FAMILIES = {  # flags, torch's capability -> what auto picks
    "amx": (AMX, "AVX512", "bf16"),
    "avx512-bf16-only": (frozenset("avx2 fma avx512f avx512_bf16".split()), "AVX512", "bf16"),
    "avx512-without-bf16": (AVX512_NO_BF16, "AVX512", "fp32"),
    "avx2": (AVX2, "AVX2", "fp32"),
    "amx-with-torch-on-avx2-kernels": (AMX, "AVX2", "fp32"),  # ATEN_CPU_CAPABILITY=avx2
    "arm": (frozenset("fp asimd sve".split()), "DEFAULT", "fp32"),
}


def fake_cpu(monkeypatch, flags: frozenset[str], capability: str) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.setattr(hardware, "cpu_capability", lambda: capability)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_picks_bf16_only_where_it_is_native(monkeypatch, family):
    flags, capability, expected = FAMILIES[family]
    fake_cpu(monkeypatch, flags, capability)
    assert hardware.resolve("auto", "cpu") == expected
    assert hardware.native_bf16("cpu") == (expected == "bf16")
    for explicit in ("fp32", "bf16", "int8"):  # an explicit choice is kept
        assert hardware.resolve(explicit, "cpu") == explicit
    warning = hardware.slow_precision_warning("bf16", "cpu")
    assert (warning is None) == (expected == "bf16")
    if warning:
        assert "\n" not in warning and "fp32" in warning and "auto" in warning
    assert hardware.slow_precision_warning("fp32", "cpu") is None
    assert hardware.slow_precision_warning("auto", "cpu") is None


def test_training_auto_follows_the_same_rule(monkeypatch):
    from transformer.train.update import resolve_precision

    fake_cpu(monkeypatch, AVX2, "AVX2")
    assert resolve_precision("auto", torch.device("cpu")) is None  # fp32
    assert resolve_precision("bf16", torch.device("cpu")) is torch.bfloat16  # as asked
    fake_cpu(monkeypatch, AMX, "AVX512")
    assert resolve_precision("auto", torch.device("cpu")) is torch.bfloat16


def test_decoding_auto_resolves_when_the_model_is_converted(monkeypatch, make_model):
    model = make_model()
    fake_cpu(monkeypatch, AVX2, "AVX2")
    decoded, d = decoding_model(model, DecodingConfig(), warn=False)
    assert DecodingConfig().precision == "auto" and d.precision == "fp32"
    assert all(a is b for a, b in zip(decoded.parameters(), model.parameters()))  # its weights, not a copy
    fake_cpu(monkeypatch, AMX, "AVX512")
    decoded, d = decoding_model(model, DecodingConfig(), warn=False)
    assert d.precision == "bf16" and {p.dtype for p in decoded.parameters()} == {torch.bfloat16}


def test_explicit_bf16_on_an_avx2_cpu_runs_with_one_warning(monkeypatch, make_model):
    fake_cpu(monkeypatch, AVX2, "AVX2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoded, d = decoding_model(make_model(), DecodingConfig(precision="bf16"))
    assert d.precision == "bf16" and {p.dtype for p in decoded.parameters()} == {torch.bfloat16}
    assert len(caught) == 1 and "emulates bf16" in str(caught[0].message)
    fake_cpu(monkeypatch, AMX, "AVX512")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoding_model(make_model(), DecodingConfig(precision="bf16"))


@pytest.mark.parametrize("family", ["amx", "avx2"])
def test_int8_multiplies_in_what_the_cpu_is_fast_at(monkeypatch, make_model, rand_tokens, family):
    """Where nothing is measured (the suite: TRANSFORMER_MEASURE=off), the flags pick the
    int8 kernel measured fastest on such CPUs: weight-only bf16 on AMX, fbgemm's GEMM on AVX2."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no fbgemm")
    flags, capability, expected = FAMILIES[family]
    fake_cpu(monkeypatch, flags, capability)
    dtype = torch.bfloat16 if expected == "bf16" else torch.float32
    assert choose.by_flags("int8") == ("weight-only-bf16" if family == "amx" else "fbgemm")
    model = make_model()
    q = for_inference(model, "int8")
    layers = [m for m in q.modules() if isinstance(m, Int8Linear)]
    assert layers and all(m.out_dtype == dtype and m.kernel == choose.by_flags("int8") for m in layers)
    src = rand_tokens([5, 3], vocab=13)
    tgt = rand_tokens([4, 4], vocab=13)
    with torch.inference_mode():
        ref, got = model(src, tgt), q(src, tgt).float()
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    # int8 weights: close to fp32 (bf16 arithmetic adds its own rounding on top; the int8
    # GEMM of a CPU without native bf16 quantises the activations too, to 7 bits there)
    tol = 0.05 if dtype == torch.bfloat16 else 0.08
    assert (got - ref).abs().max() < tol * ref.abs().max()


def test_this_machine_is_described_and_decides_consistently():
    d = hardware.describe()
    assert d["capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(d["flags"]) <= set(hardware.FLAGS_THAT_MATTER)
    assert hardware.resolve("auto") == ("bf16" if d["native_bf16"] else "fp32")
    assert d["cpu"] and d["cpu"] in hardware.describe_line()


def test_torchs_own_switch_makes_an_avx512_machine_choose_fp32():
    """``ATEN_CPU_CAPABILITY=avx2`` (torch's switch) runs torch's AVX2 kernels: there bf16
    is emulated, so auto must pick fp32 whatever the flags say."""
    code = "from transformer import hardware; print(hardware.cpu_capability(), hardware.resolve('auto'))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["AVX2", "fp32"]


def test_int8_on_an_avx2_cpu_multiplies_with_an_int8_gemm(monkeypatch, make_model, rand_tokens):
    """Without native bf16, eager int8 layers use fbgemm's int8 GEMM; a graph being traced
    (torch.export, compiled decoding) takes the weight-only path; both stay close to fp32,
    and the model deep-copies (precision copies, ensembles) after its first call."""
    import copy

    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no fbgemm")
    fake_cpu(monkeypatch, AVX2, "AVX2")
    assert choose.by_flags("int8") == "fbgemm"
    model = make_model(d_model=32, d_ff=64)
    q = for_inference(model, "int8")
    layers = [m for m in q.modules() if isinstance(m, Int8Linear)]
    assert layers and all(m.int8_gemm for m in layers)
    calls = []
    real = torch.ops.quantized.linear_dynamic
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", lambda *a: calls.append(1) or real(*a), raising=False)
    src, tgt = rand_tokens([6, 4], vocab=13), rand_tokens([5, 5], vocab=13)
    runs = []  # every int8 layer that runs (the fused ones run in place of the layers they hold)
    for m in layers:
        m.register_forward_hook(lambda *_: runs.append(1))
    with torch.inference_mode():
        ref, got = model(src, tgt), q(src, tgt)
    assert runs and len(calls) >= len(runs) and got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # as under torch.export
    n = len(calls)
    with torch.inference_mode():
        traced = q(src, tgt)
    assert len(calls) == n  # the weight-only path: no GEMM call
    n = len(calls)
    with torch.inference_mode():
        q(src, tgt)
    assert len(calls) == n and (traced - ref).abs().max() < 0.03 * ref.abs().max()
    monkeypatch.undo()
    fake_cpu(monkeypatch, AVX2, "AVX2")
    with torch.inference_mode():
        torch.testing.assert_close(copy.deepcopy(q)(src, tgt), got)
    fake_cpu(monkeypatch, AMX, "AVX512")
    assert choose.by_flags("int8") == "weight-only-bf16"
    assert not any(m.int8_gemm for m in for_inference(model, "int8").modules() if isinstance(m, Int8Linear))


def test_int8_that_multiplies_with_the_int8_gemm_decodes_eagerly_even_when_compiling_is_asked(
        monkeypatch, make_model):
    """A compiled step cannot call fbgemm's int8 GEMM (it would hold the weights dequantised
    to float32: a package larger than fp32's, measured slower than the eager GEMM), so an
    int8 model on an AVX2 CPU decodes eagerly: silently under ``auto``, with one warning
    under ``on``. Where bf16 is native the int8 model compiles as before."""
    import warnings

    from transformer.compiled import CompiledStepWarning
    from transformer.decode.decoding_config import DecodingConfig
    from transformer.decode.precision import uses_int8_gemm
    from transformer.inference.translator import Translator

    def should_compile(when: str, model) -> bool:
        decoding = DecodingConfig(compile=when, beam=1, precision="fp32")
        return Translator(model, None, decoding, warn=False).compiles()[0]

    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch build has no fbgemm")
    model = make_model(d_model=32, d_ff=64)
    fake_cpu(monkeypatch, AVX2, "AVX2")
    q = for_inference(model, "int8")
    assert uses_int8_gemm(q) and not uses_int8_gemm(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not should_compile("auto", q)
        assert not caught
        assert not should_compile("on", q)
    assert [w.category for w in caught] == [CompiledStepWarning]
    assert "int8 GEMM" in str(caught[0].message) and "decoding eagerly" in str(caught[0].message)
    assert should_compile("on", for_inference(model, "fp32"))  # fp32 on the same CPU compiles
    fake_cpu(monkeypatch, AMX, "AVX512")
    q = for_inference(model, "int8")
    assert not uses_int8_gemm(q) and should_compile("on", q)


def test_torchs_switch_gets_an_inductor_cache_of_its_own(tmp_path):
    """Kernels that inductor cached under ATEN_CPU_CAPABILITY=avx2 and loaded without it gave
    wrong sums and heap corruption (torch 2.13 does not key its cache on the switch): under the
    switch every build points inductor at a private folder of its own, unless the user chose one."""
    code = ("from transformer.run.private import use_private_build_folder; use_private_build_folder(); "
            "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    env["TRANSFORMER_COMPILED_DIR"] = str(tmp_path / "cache")
    chosen = tmp_path / "mine"
    chosen.mkdir(mode=0o700)

    def folder(**more) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**env, **more}).stdout.strip()

    assert folder() == str(tmp_path / "cache" / "inductor")
    assert folder(ATEN_CPU_CAPABILITY="avx2") == str(tmp_path / "cache" / "inductor-avx2")
    assert folder(ATEN_CPU_CAPABILITY="avx2", TORCHINDUCTOR_CACHE_DIR=str(chosen)) == str(chosen)


def test_fbgemm_quantises_activations_to_8_bits_where_the_cpu_has_vnni(monkeypatch):
    """fbgemm's activations: 7 bits where AVX2's 16-bit pair sums could saturate, 8 bits on a
    CPU with VNNI (32-bit sums), which halves the error against fp32 (run where the CPU
    really has VNNI: elsewhere 8 bits may saturate)."""
    from torch import nn

    if "fbgemm" not in torch.backends.quantized.supported_engines or not hardware.cpu_has_vnni():
        pytest.skip("needs fbgemm and a CPU with VNNI")
    torch.manual_seed(0)
    lin, x = nn.Linear(256, 128), torch.randn(32, 256) * 3
    errors = {}
    for name, flags in (("avx2", AVX2), ("vnni", AVX512_NO_BF16)):
        fake_cpu(monkeypatch, flags, "AVX512")
        q = Int8Linear.from_linear(lin, "fbgemm")
        assert q.reduce_range == (name == "avx2")
        with torch.inference_mode():
            errors[name] = (q(x) - lin(x)).abs().mean().item()
    assert errors["vnni"] < 0.7 * errors["avx2"]


@pytest.mark.parametrize("flags, capability, fbgemm_limit, vnni", [
    (AVX512_NO_BF16, "AVX512", None, True),        # AVX512-VNNI, fbgemm free to use it
    (AVX512_NO_BF16, "AVX512", "AVX512_VNNI", True),
    (AVX512_NO_BF16, "AVX512", "AVX2", False),     # the AVX2 stand-in: fbgemm's AVX2 kernels saturate
    (AVX512_NO_BF16, "AVX2", None, False),         # torch told to stay on AVX2
    (AVX2, "AVX2", None, False),
    (frozenset("avx2 fma avx512f avx512_bf16".split()), "AVX512", None, False),  # AVX-512 without VNNI
])
def test_fbgemm_gets_8_bit_activations_only_where_its_vnni_kernels_run(monkeypatch, flags, capability,
                                                                         fbgemm_limit, vnni):
    fake_cpu(monkeypatch, flags, capability)
    if fbgemm_limit is None:
        monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    else:
        monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", fbgemm_limit)
    assert hardware.cpu_has_vnni() is vnni
    from torch import nn
    assert Int8Linear.from_linear(nn.Linear(8, 4), "fbgemm").reduce_range is (not vnni)
