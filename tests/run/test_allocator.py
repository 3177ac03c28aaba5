"""Decoding on a CPU asks glibc to keep freed memory (inference/allocator.py): what it sets,
once, and when it leaves the allocator alone."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transformer.inference import allocator


class FakeLibc:
    def __init__(self, answer: int = 1) -> None:
        self.calls, self.answer = [], answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(allocator, "_done", None)


def test_sets_the_largest_mmap_threshold_and_keeps_the_heap_once():
    libc = FakeLibc()
    assert allocator.keep_freed_memory(libc, environ={}) is True
    assert libc.calls == [(allocator.M_MMAP_THRESHOLD, 32 << 20), (allocator.M_TRIM_THRESHOLD, 1 << 30)]
    assert allocator.keep_freed_memory(libc, environ={}) is True
    assert len(libc.calls) == 2  # once per process


@pytest.mark.parametrize("environ,why", [
    ({"TRANSFORMER_MALLOC": "system"}, "TRANSFORMER_MALLOC=system"),
    ({"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX is set"),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so"}, "an allocator may be preloaded (LD_PRELOAD)"),
])
def test_the_users_own_choice_is_left_alone(environ, why):
    libc = FakeLibc()
    assert allocator.left_alone(environ, "glibc") == why
    assert allocator.keep_freed_memory(libc, environ=environ) is False
    assert libc.calls == []


def test_another_c_library_is_left_alone():
    assert allocator.left_alone({}, "musl") == "not glibc"
    assert allocator.left_alone({}, "glibc") is None


def test_a_refused_setting_reports_false():
    assert allocator.keep_freed_memory(FakeLibc(answer=0), environ={}) is False


def test_this_glibc_takes_the_settings():
    # in a fresh interpreter, with this machine's C library (glibc here and in CI)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "TRANSFORMER_MALLOC")}
    code = "from transformer.inference import allocator; print(allocator.left_alone(), allocator.keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()
    if out[0] == "None":  # glibc: mallopt took both values
        assert out == ["None", "True"]
    else:
        assert out[-1] == "False"


def test_a_cpu_decoding_front_door_sets_it(monkeypatch):
    from test_front_door import Letters, translation_model
    from transformer.inference import front_door
    from transformer.inference.translator import Translator

    calls = []
    monkeypatch.setattr(front_door, "keep_freed_memory", lambda: calls.append("set"))
    Translator(translation_model(), Letters())
    assert calls == ["set"]
