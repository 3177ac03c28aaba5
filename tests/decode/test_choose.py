"""Decoding's choices come from a measurement (decode/choose.py): the faster path measured is
the one chosen, a faked slow path never is; a failing measurement falls back to the flags with
one line; the times are kept in the private cache and read back, and a cache file that is
corrupt, writable by others or a link is ignored with one line and measured again."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from transformer.cli import main
from transformer.decode import choose, int8
from transformer.decode.int8 import INT8_KERNELS, Int8Linear
from transformer.decode.precision import for_inference
from transformer.run.weights import save_weights


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring switched on (the suite runs with TRANSFORMER_MEASURE=off), with a cache of
    this test's own and nothing remembered from another test."""
    monkeypatch.delenv(choose.ENV_VAR, raising=False)
    monkeypatch.setenv("TRANSFORMER_COMPILED_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setattr(choose, "_failed", set())
    # int_mm a candidate on every machine: these tests fake the times and check the choice (where
    # its sums are not exact it is never timed: test_precision.py's int_mm test)
    monkeypatch.setattr(int8, "_INT_MM_EXACT", [True])
    return tmp_path / "cache"


def fake_times(monkeypatch, slow: set[str], fastest: str = "int_mm") -> list[str]:
    """time_shape faked: ``fastest`` takes 1.0 ms a call, those in ``slow`` 10 ms, fp32 1.1 ms,
    every other 1.05 ms; fp32 and bf16 through oneDNN (packed or not) as fp32 and bf16 (so F.linear
    stays) unless named; the shapes timed are recorded in the list returned."""
    timed = []

    def time_shape(d_in, d_out, names):
        timed.append(f"{d_in}x{d_out}")
        return {n: 0.010 if m in slow else 0.001 if m == fastest else 0.0011 if m == "fp32" else 0.00105
                for n in names for m in [n if n in slow or n == fastest else n.removesuffix("-onednn").removesuffix("-packed")]}

    monkeypatch.setattr(choose, "time_shape", time_shape)
    return timed


def test_the_faster_precision_is_chosen_and_a_faked_slow_one_never(measuring, monkeypatch, make_model):
    model = make_model()
    fake_times(monkeypatch, slow={"bf16"})
    assert choose.auto_precision(model) == "fp32"
    full = for_inference(model, "auto")  # fp32: the model's own weights, not a copy of them
    assert all(a is b for a, b in zip(full.parameters(), model.parameters()))
    monkeypatch.setattr(choose, "_memory", {})
    (measuring / next(p.name for p in measuring.glob("kernels-*.json"))).unlink()
    fake_times(monkeypatch, slow={"fp32"})
    assert choose.auto_precision(model) == "bf16"
    assert {p.dtype for p in for_inference(model, "auto").parameters()} == {torch.bfloat16}


def test_fastest_allows_int8_where_it_measured_fastest_and_auto_never_takes_it(measuring, monkeypatch, make_model):
    model = make_model()
    fake_times(monkeypatch, slow=set(), fastest="int_mm")  # int8 1.0 ms a call, the floats 1.05-1.1
    assert choose.auto_precision(model) != "int8"
    assert choose.auto_precision(model, int8=True) == "int8"
    assert isinstance(for_inference(model, "fastest").out_proj, Int8Linear)
    monkeypatch.setattr(choose, "_memory", {})
    for f in measuring.glob("kernels-*.json"):
        f.unlink()
    fake_times(monkeypatch, slow=set(INT8_KERNELS), fastest="bf16")  # every int8 kernel made slow
    assert choose.auto_precision(model, int8=True) == "bf16"
    assert {p.dtype for p in for_inference(model, "fastest").parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("fastest, slow", [("int_mm", "fbgemm"), ("weight-only-fp32", "int_mm"),
                                           ("fbgemm", "weight-only-bf16")])
def test_each_int8_layer_takes_the_kernel_measured_fastest(measuring, monkeypatch, make_model, fastest, slow):
    """Every layer, the output projection included, takes the kernel measured fastest; the
    one made slow is never chosen."""
    fake_times(monkeypatch, slow={slow}, fastest=fastest)
    q = for_inference(make_model(), "int8")
    assert isinstance(q.out_proj, Int8Linear)
    assert {m.kernel for m in q.modules() if isinstance(m, Int8Linear)} == {fastest}


def test_a_real_measurement_does_not_choose_a_path_made_slow(measuring, monkeypatch):
    """time_shape itself (a tiny shape, so it takes milliseconds): bf16's call made slow by
    3 ms of work (CPU time: what is measured) is measured slowest."""
    import time

    real = choose.candidates

    def busy(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def candidates(d_in, d_out, rows, names):
        out = real(d_in, d_out, rows, names)
        call, arg = out["bf16"]
        out["bf16"] = (lambda v: (busy(0.003), call(v))[1], arg)
        return out

    monkeypatch.setattr(choose, "candidates", candidates)
    times = choose.time_shape(8, 8, choose.names_to_time())
    assert set(times) == set(choose.names_to_time()) and all(t > 0 for t in times.values())
    assert times["bf16"] >= len(choose.ROWS) * 0.003 and min(times, key=times.get) != "bf16"
    assert choose.int8_kernels([(8, 8)])[8, 8] in INT8_KERNELS


def test_a_kernel_that_cannot_run_is_never_chosen_and_the_rest_still_measured(measuring, monkeypatch, make_model,
                                                                                 capsys, tmp_path):
    """oneDNN's bf16 under ONEDNN_MAX_CPU_ISA=AVX2 fails to build its primitive: that candidate
    alone is left out (infinite time), the others are measured and chosen from, and the cache
    and `transformer info` say so."""
    real = choose.candidates

    def candidates(d_in, d_out, rows, names):
        out = real(d_in, d_out, rows, names)
        if "bf16-onednn" in out:
            def refuse(v):
                raise RuntimeError("could not create a primitive descriptor")
            out["bf16-onednn"] = (refuse, out["bf16-onednn"][1])
        return out

    monkeypatch.setattr(choose, "candidates", candidates)
    with warnings.catch_warnings():
        warnings.simplefilter("error", choose.MeasureWarning)  # no fallback to the flags
        times = choose.measured([(8, 8)])["8x8"]
        assert choose.onednn_shapes([(8, 8)], "bf16") == set()
    if "bf16-onednn" in times:  # (this torch build has oneDNN's linear)
        assert times["bf16-onednn"] == float("inf")
    assert all(0 < t < float("inf") for n, t in times.items() if n != "bf16-onednn")
    monkeypatch.setattr(choose, "_memory", {})  # read back from the cache file
    assert choose.measured([(8, 8)])["8x8"] == times
    model = make_model()
    save_weights(model, tmp_path / "m.safetensors")
    assert main(["info", "--model", str(tmp_path / "m.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and ("bf16-onednn cannot run" in out or "bf16-onednn" not in times)


def test_a_failed_measurement_falls_back_to_the_flags_with_one_line(measuring, monkeypatch, make_model):
    def broken(d_in, d_out, names):
        raise RuntimeError("no such kernel\nsecond line")

    monkeypatch.setattr(choose, "time_shape", broken)
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert choose.auto_precision(model) == choose.by_flags("auto")
        assert set(choose.int8_kernels([(16, 32)]).values()) == {choose.by_flags("int8")}  # no second warning
    assert [w.category for w in caught] == [choose.MeasureWarning]
    message = str(caught[0].message)
    assert "\n" not in message and "no such kernel" in message and "flags" in message


def test_the_times_are_kept_and_read_back_by_the_next_process(measuring, monkeypatch, make_model):
    timed = fake_times(monkeypatch, slow={"bf16"})
    model = make_model()
    assert choose.auto_precision(model) == "fp32"
    n = len(timed)
    assert n == len(set(choose.decoder_shapes(model)))
    [path] = measuring.glob("kernels-*.json")
    kept = json.loads(path.read_text())
    assert kept["machine"] == choose.machine() and set(kept["shapes"]) == set(timed)
    assert not path.stat().st_mode & 0o022
    monkeypatch.setattr(choose, "_memory", {})  # a new process
    assert choose.auto_precision(model) == "fp32" and len(timed) == n  # read, not timed again
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # another torch: timed again, its own file
    choose.auto_precision(model)
    assert len(timed) == 2 * n and len(list(measuring.glob("kernels-*.json"))) == 2


@pytest.mark.parametrize("damage", ["corrupt", "not-json", "writable-by-others", "link"])
def test_a_damaged_or_foreign_cache_file_is_ignored_with_one_line(measuring, monkeypatch, make_model, damage,
                                                                    tmp_path):
    timed = fake_times(monkeypatch, slow={"bf16"})
    model = make_model()
    choose.auto_precision(model)
    [path] = measuring.glob("kernels-*.json")
    if damage == "corrupt":
        path.write_text(json.dumps({"shapes": {"16x16": {"bf16": "fast"}}}))
    elif damage == "not-json":
        path.write_bytes(b"\xff{{{")
    elif damage == "writable-by-others":
        os.chmod(path, 0o666)
    else:
        elsewhere = tmp_path / "planted.json"
        elsewhere.write_text(path.read_text())
        path.unlink()
        path.symlink_to(elsewhere)
    monkeypatch.setattr(choose, "_memory", {})
    before = len(timed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert choose.auto_precision(model) == "fp32"
    assert len(timed) > before  # measured again
    assert [w.category for w in caught] == [choose.MeasureWarning]
    assert str(path) in str(caught[0].message) and "ignored" in str(caught[0].message)
    assert "\n" not in str(caught[0].message)
    assert not path.is_symlink() and json.loads(path.read_text())["shapes"]  # replaced by a good one


def test_measuring_switched_off_uses_the_flags_silently(measuring, monkeypatch, make_model):
    timed = fake_times(monkeypatch, slow=set())
    monkeypatch.setenv(choose.ENV_VAR, "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose.auto_precision(make_model()) == choose.by_flags("auto")
    assert timed == [] and not list(measuring.glob("kernels-*.json"))


def test_info_shows_the_choice_and_the_rates(measuring, monkeypatch, make_model, tmp_path, capsys):
    fake_times(monkeypatch, slow={"bf16", "fbgemm"})
    model = make_model()
    save_weights(model, tmp_path / "m.safetensors")
    assert main(["info", "--model", str(tmp_path / "m.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "precision auto: fp32" in out and "measured on one thread at 16 and 128 rows" in out
    d, v = model.cfg.d_model, model.cfg.target_vocab_size
    line = next(line for line in out.splitlines() if line.strip().startswith(f"{d}x{v}:"))
    assert "int8 kernel int_mm" in line and "GMAC/s" in line and "fbgemm" in line
    assert main(["info", "--model", str(tmp_path / "m.safetensors"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["decoding"]
    assert report["source"] == "measured" and report["auto"] == "fp32"
    assert all(s["int8"] == "int_mm" for s in report["shapes"])


def test_a_failed_measurement_is_one_line_in_a_command(measuring, monkeypatch, make_model, tmp_path, capsys):
    monkeypatch.setattr(choose, "time_shape", lambda *a: (_ for _ in ()).throw(MemoryError("out of it")))
    save_weights(make_model(), tmp_path / "m.safetensors")
    assert main(["info", "--model", str(tmp_path / "m.safetensors")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: cannot measure") and "flags" in err


def test_an_ensemble_is_measured_by_its_members_shapes(measuring, monkeypatch, make_model):
    from transformer.decode.ensemble import Ensemble

    timed = fake_times(monkeypatch, slow={"bf16"})
    small, wide = make_model(), make_model(d_model=32, d_ff=64)
    assert choose.auto_precision(Ensemble([small, wide])) == "fp32"
    assert set(timed) == {f"{i}x{o}" for m in (small, wide) for i, o in choose.decoder_shapes(m)}


def test_a_library_limited_below_the_cpu_is_another_cache(monkeypatch):
    """Times measured with oneDNN or MKL told to use fewer instructions (the AVX2 stand-in's
    variables) are kept apart from the times without the limit, and vice versa."""
    for name in choose.KERNEL_LIMITS:
        monkeypatch.delenv(name, raising=False)
    plain = choose.machine()
    assert "limits" not in plain
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    limited = choose.machine()
    assert limited["limits"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert choose.cache_file(limited) != choose.cache_file(plain)
