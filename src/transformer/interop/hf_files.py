"""The weights of a Hugging Face model folder, read one tensor at a time, and a safetensors
file written one tensor at a time: an import holds little more than its largest tensor.

    weights = HFWeights(folder)          # model.safetensors, its shards, or pytorch_model.bin
    t = weights.get("model.embed_tokens.weight")
    for block in weights.row_blocks("model.embed_tokens.weight"): ...   # a few MB of rows at a time
    write_safetensors(path, shapes, tensors, metadata)   # shapes first (the header), then the data

``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``: a file that asks to
run code when unpickled is refused, not run. Only files inside the folder are opened (a shard
index naming ``../x`` or ``/etc/passwd`` is refused: :func:`~.hf_folder.folder_file`).
"""
from __future__ import annotations

import json
import math
import pickle
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..errors import UserError
from .hf_folder import create, folder_file

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a readable shard index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict):
        raise UserError(f"{path}: weight_map is not a mapping of tensor name: file")
    return {str(k): str(v) for k, v in weight_map.items()}


class HFWeights:
    """The tensors of one HF model folder by name, loaded on demand (safetensors: one tensor at
    a time, the file mapped only while it is read). GPT-2 checkpoints saved without the
    ``transformer.`` prefix are found under the prefixed names too."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.files: dict[str, Path] = {}  # tensor name -> file
        self._bin: dict[str, torch.Tensor] = {}
        index_file, bin_index = self._file(SAFETENSORS_INDEX), self._file(BIN_INDEX)
        if index_file.is_file():
            index = _read_index(index_file)
            self.files = {name: folder_file(self.folder, f, index_file) for name, f in index.items()}
            for f in set(self.files.values()):
                self._keys(f)  # every shard readable, before anything is written
        elif sorted(self.folder.glob("*.safetensors")):
            for f in sorted(self.folder.glob("*.safetensors")):
                self.files.update({name: f for name in self._keys(self._file(f.name))})
        elif self._file("pytorch_model.bin").is_file() or bin_index.is_file():
            shards = ([self._file("pytorch_model.bin")] if self._file("pytorch_model.bin").is_file()
                      else sorted({folder_file(self.folder, f, bin_index) for f in _read_index(bin_index).values()}))
            for f in shards:
                self._bin.update(_load_bin(f))
        else:
            raise UserError(f"{self.folder}: no weights (model.safetensors, its shards, or pytorch_model.bin)")

    def _file(self, name: str) -> Path:
        return folder_file(self.folder, name, self.folder)

    def _keys(self, path: Path) -> list[str]:
        if not path.is_file():
            raise UserError(f"{path}: weights file not found (named by {SAFETENSORS_INDEX})")
        try:
            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None

    def names(self) -> set[str]:
        return set(self.files) | set(self._bin)

    def _name(self, name: str) -> str | None:
        for candidate in (name, name.removeprefix("transformer.")):
            if candidate in self.files or candidate in self._bin:
                return candidate
        return None

    def _found(self, name: str) -> str:
        """The stored name of tensor ``name``; UserError when the checkpoint has none."""
        found = self._name(name)
        if found is None:
            raise UserError(f"{self.folder}: the checkpoint has no tensor {name}")
        return found

    def __contains__(self, name: str) -> bool:
        return self._name(name) is not None

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of a tensor, read from the file's header (no data loaded)."""
        found = self._found(name)
        if found in self._bin:
            return tuple(self._bin[found].shape)
        with safe_open(str(self.files[found]), framework="pt") as f:
            return tuple(f.get_slice(found).get_shape())

    def numbers(self) -> int:
        """How many numbers the checkpoint's tensors hold, from the headers."""
        held = sum(t.numel() for t in self._bin.values())
        for path in set(self.files.values()):
            with safe_open(str(path), framework="pt") as f:
                held += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        return held

    def dtype(self, name: str) -> torch.dtype:
        """The dtype of a tensor, read from the file's header (no data loaded)."""
        found = self._found(name)
        if found in self._bin:
            return self._bin[found].dtype
        with safe_open(str(self.files[found]), framework="pt") as f:
            code = f.get_slice(found).get_dtype()
        dtype = next((d for d, c in DTYPES.items() if c == code), None)
        if dtype is None:
            raise UserError(f"{self.files[found]}: {found} has dtype {code}, not one a model is stored in")
        return dtype

    def get(self, name: str) -> torch.Tensor:
        found = self._found(name)
        if found in self._bin:
            return self._bin[found]
        try:
            with safe_open(str(self.files[found]), framework="pt") as f:
                return f.get_tensor(found)
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{self.files[found]}: cannot read {found}, truncated or corrupt ({e})") from None


    def row_blocks(self, name: str, size: int = 1 << 24) -> Iterator[torch.Tensor]:
        """Tensor ``name`` as blocks of whole rows of about ``size`` bytes, in order, each read
        on its own, so a large embedding is never whole in memory. A tensor of a pytorch_model.bin (mapped already)
        comes as one block, as does one without rows."""
        found = self._found(name)
        if found in self._bin:
            yield self._bin[found]
            return
        path = self.files[found]
        try:
            with safe_open(str(path), framework="pt") as f:
                shape = f.get_slice(found).get_shape()
            if len(shape) < 2:
                yield self.get(name)
                return
            step = max(1, size // max(1, self.dtype(name).itemsize * math.prod(shape[1:])))
            for start in range(0, shape[0], step):
                # the file opened for each block: held open, the blocks read stayed resident (measured)
                with safe_open(str(path), framework="pt") as f:
                    yield f.get_slice(found)[start:start + step]
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f"{path}: cannot read {found}, truncated or corrupt ({e})") from None


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # an old (non-zip) file cannot be mapped
        state = _load_bin_unmapped(path)
    except pickle.UnpicklingError as e:
        raise _refused(path, e) from None
    except (OSError, EOFError, ValueError) as e:
        raise _unreadable(path, e) from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise UserError(f"{path}: not a state dict of tensors")
    return state


def _refused(path: Path, e: pickle.UnpicklingError) -> UserError:
    """The one line for a pickle that asks for more than tensors. torch's own message is not
    passed on: it advises loading the file again with ``weights_only=False``, which runs the
    code the file names; only what the file asked for is kept (``GLOBAL posix.system``,
    ``Unsupported operand 110``)."""
    if "Weights only load failed" not in str(e):  # a damaged pickle, not one weights-only loading refused
        return _unreadable(path, e)
    asked = re.search(r"GLOBAL ([\w.]+)", str(e))
    if asked:
        what = f"unpickling this file would run code or build objects (it asks for {asked.group(1)})"
    else:
        lines = [line.strip() for line in str(e).splitlines()]
        said = next((line for line in lines if line and not line.startswith(_TORCH_ADVICE)
                     and "weights_only" not in line and "\x1b" not in line), "")
        what = f"not a file of tensors only ({said or 'refused by weights-only loading'})"
    return UserError(f"{path}: refused: {what}, so it is not loaded; use the model's safetensors weights "
                     "(model.safetensors) from a source you trust, or have whoever made this file convert it to "
                     "safetensors with the tool that made it")


# the lines of torch's refusal that are its advice, not what the file holds
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation", "(1)", "(2)")


def _unreadable(path: Path, e: Exception) -> UserError:
    said = next((line for line in str(e).splitlines() if line.strip() and "weights_only" not in line),
                type(e).__name__)
    return UserError(f"{path}: not a readable PyTorch weights file ({said})")


def _load_bin_unmapped(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _refused(path, e) from None
    except Exception as e:  # noqa: BLE001 (text or random bytes: the unpickler's KeyError, EOFError, ...)
        raise _unreadable(path, e) from None


def write_safetensors(path: str | Path, shapes: list[tuple[str, tuple[int, ...], torch.dtype]],
                      tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, str]) -> None:
    """Write the new safetensors file ``path`` from ``shapes`` (name, shape, dtype), in that order, and
    ``tensors``, which yields the same names in the same order: the header goes first, then
    each tensor's bytes as it comes, so only one tensor is in memory at a time. A tensor may
    come in consecutive blocks of its rows under its name (:meth:`HFWeights.row_blocks`)."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, shape, dtype in shapes:
        size = dtype.itemsize * math.prod(shape)
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    expected: Iterator[tuple[str, tuple[int, ...], torch.dtype]] = iter(shapes)
    want, shape, left = None, (), 0  # the tensor being written, and how many of its rows are still to come
    with create(Path(path)) as f:  # a new file: never written through a link
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, t in tensors:
            if left and name != want[0]:
                _short(want[0], shape, left)
            if left == 0:
                want = next(expected, None)
                if want is None:
                    raise UserError(f"{name}: more tensors than the model has")
                shape = tuple(want[1])
                left = shape[0] if shape else 0
            if left:  # rows, whole or in blocks
                fits = t.dim() == len(shape) and tuple(t.shape[1:]) == shape[1:] and 0 < t.shape[0] <= left
            else:  # a scalar, or a tensor without rows: whole
                fits = tuple(t.shape) == shape
            if not (fits and name == want[0] and t.dtype == want[2]):
                raise UserError(f"{name}: shape {tuple(t.shape)} {t.dtype} does not fit the model's "
                                f"{shape} {want[2]}; the checkpoint does not match its config.json")
            left = left - t.shape[0] if left else 0
            data = t.detach().contiguous().cpu()
            if data.numel():
                f.write(memoryview(data.reshape(-1).view(torch.uint8).numpy()))
        if left:
            _short(want[0], shape, left)
        if next(expected, None) is not None:
            raise UserError(f"{path}: fewer tensors than the model has")


def _short(name: str, shape: tuple[int, ...], left: int) -> None:
    given = (shape[0] - left, *shape[1:])
    raise UserError(f"{name}: shape {given} does not fit the model's {shape}; the checkpoint does not match its "
                    "config.json")
