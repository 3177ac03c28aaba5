"""Counting reads of model-side values back to the host: ``.item()``, ``float()``, ``int()``,
``bool()`` and ``.tolist()`` of a floating-point or bool tensor. On a GPU each one waits for
every kernel queued before it (a synchronisation), so the training loop must make few of them;
on a CPU they cost little, which is why they are counted rather than timed. Integer tensors
(token ids, counts the data side computes) are not counted. Importable from every test folder.

    with HostReads() as reads:
        trainer.train()
    reads.count, reads.where()   # how many, and from which lines of the package
"""
from __future__ import annotations

import collections
import sys

import torch

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


class HostReads:
    """A context manager that patches ``torch.Tensor``'s read methods for its duration and
    counts the reads of floating-point and bool tensors, with the package line that made each."""

    def __init__(self, package: str = "transformer") -> None:
        self.package, self.count, self.sites = package, 0, collections.Counter()
        self._saved: dict[str, object] = {}

    def _counted(self, name: str, real):
        def read(tensor, *args, **kwargs):
            if tensor.is_floating_point() or tensor.dtype == torch.bool:
                self.count += 1
                self.sites[self._site()] += 1
            return real(tensor, *args, **kwargs)

        return read

    def _site(self) -> str:
        """The innermost frame of the package that made the read (file:line), else '?'."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name == self.package or name.startswith(self.package + "."):
                return f"{name}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def where(self) -> str:
        """The reads by site, most first: for a failing assertion's message."""
        return ", ".join(f"{site} x{n}" for site, n in self.sites.most_common())

    def __enter__(self) -> HostReads:
        for name in READS:
            real = getattr(torch.Tensor, name)
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._counted(name, real))
        return self

    def __exit__(self, *exc) -> None:
        for name, saved in self._saved.items():
            if saved is None:  # inherited from torch._C.TensorBase: remove the patch to uncover it
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, saved)
