"""Running out of memory while decoding (a huge beam or batch) or training is one line that
says what to lower, exit code 2, never a traceback. The failure here is a real one: an
allocation the allocator refuses (torch.empty of 40 TB), raised where decoding allocates."""
from __future__ import annotations

import pytest
import torch

from transformer.cli import main, out_of_memory
from transformer.inference.translator import Translator


def _allocate_too_much(*args, **kwargs):
    return torch.empty(10**13)  # 40 TB: refused by the allocator (DefaultCPUAllocator)


def test_out_of_memory_while_translating_is_one_line_naming_what_to_lower(trained, monkeypatch, capsys):
    monkeypatch.setattr(Translator, "_decode", _allocate_too_much)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("red dog\n"))
    code = main(["translate", "--model", str(trained.run), "--beam", "4"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == ["transformer translate: error: out of memory (tried to allocate 37252.9 GiB); "
                                "lower --beam, or --max-tokens (the source tokens decoded together)"]


def test_other_runtime_errors_are_not_taken_for_memory(trained, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(Translator, "_decode", broken)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("red dog\n"))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):  # a fault of the code: its traceback
        main(["translate", "--model", str(trained.run)])


@pytest.mark.parametrize("error,short", [
    (MemoryError(), "an allocation failed"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                            "79.1 GiB"), "tried to allocate 2.00 GiB"),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes."),
     "tried to allocate 1.0 GiB"),
    (RuntimeError("expected scalar type Float but found BFloat16"), None),
])
def test_what_an_out_of_memory_error_says(error, short):
    assert out_of_memory(error) == short
