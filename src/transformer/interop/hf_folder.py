"""A model folder is read only inside itself, and a run is written only into new files of its
own. A folder from elsewhere (a hub repository, an archive) is data, but it can hold what
plain data cannot: a symbolic link (``tokenizer_config.json`` -> a file of the user's) that an
import would read and copy into the run, or a shard index naming ``../../x.safetensors`` or
``/etc/passwd``. So:

- every link in the folder must resolve inside it (:func:`refuse_outside_links`), but for the
  one kind of link the Hugging Face hub's cache is made of: ``snapshots/<rev>/FILE`` ->
  ``../../blobs/<sha>``, inside the same ``models--owner--name`` repository folder;
- a file that a file of the folder names (a shard index's shards) is a relative name inside
  the folder (:func:`folder_file`);
- the run's files are created new (:func:`create`, :func:`copy_in`, :func:`write_new`): anything
  already at the name, a link most of all, is an error, never written through;
- the run is written whole or not at all (:func:`write_run`), by either import (the language
  model's, hf_import.py, and Marian's, marian_run.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from ..errors import UserError
from ..run.files import atomic_dir

HUB_SNAPSHOTS, HUB_BLOBS, HUB_REPO = "snapshots", "blobs", "models--"


def _roots(folder: Path) -> list[Path]:
    """Where the files of ``folder`` may lie: in the folder (resolved), and for a snapshot of
    the hub's cache (``models--owner--name/snapshots/<rev>``) in its repository's blobs."""
    root = Path(os.path.realpath(folder))
    roots = [root]
    if root.parent.name == HUB_SNAPSHOTS and root.parent.parent.name.startswith(HUB_REPO):
        roots.append(root.parent.parent / HUB_BLOBS)
    return roots


def _inside(path: Path, roots: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == root or root in real.parents for root in roots)


def refuse_outside_links(folder: Path) -> None:
    """A one-line UserError naming the first symbolic link in ``folder`` (at any depth) that
    resolves outside it (a hub snapshot's links to its repository's blobs excepted): whatever
    reads the folder next (transformers, tokenizers, safetensors) follows links."""
    roots = _roots(folder)
    for top, dirs, names in os.walk(folder):  # followlinks=False: a linked folder is checked, not entered
        for name in sorted(dirs + names):
            path = Path(top, name)
            if path.is_symlink() and not _inside(path, roots):
                raise UserError(f"{path}: a symbolic link to {os.readlink(path)}, outside the model folder; transformer "
                                "import reads nothing outside the folder it is given: put the file itself there")


def folder_file(folder: Path, name: str, named_by: Path) -> Path:
    """``folder / name`` for a file name read from ``named_by`` (a shard index): refused in
    one line unless it is a relative name that stays inside the folder, links resolved."""
    pure = PurePosixPath(name)
    path = folder / name
    if not name or pure.is_absolute() or ".." in pure.parts or not _inside(path, _roots(folder)):
        raise UserError(f"{named_by}: names {name!r}, which is not a file of the model folder {folder}; only files "
                        "inside the folder are read (download the model again, or correct the index)")
    return path


def create(path: Path):
    """``path`` opened as a new binary file: a file or link already at the name is a one-line
    UserError (O_EXCL, O_NOFOLLOW), so nothing is ever written through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        kind = "a symbolic link" if path.is_symlink() else "a file"
        raise UserError(f"{path}: {kind} is already there in the run being written; nothing is written through "
                        "it (give a new run directory)") from None
    return open(fd, "wb")


def copy_in(source: Path, target: Path) -> None:
    """Copy the folder's file ``source`` to the new file ``target`` (:func:`create`)."""
    with open(source, "rb") as src, create(target) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def write_new(path: Path, text: str) -> None:
    """``text`` as the new UTF-8 file ``path`` (:func:`create`)."""
    with create(path) as f:
        f.write(text.encode("utf-8"))


def write_run(out: Path, fill) -> None:
    """Write the run directory ``out`` whole or not at all: ``fill(tmp)`` writes its files
    into a temporary folder that then takes its name (:func:`~transformer.run.files.atomic_dir`)."""
    try:
        atomic_dir(out, fill)
    except OSError as e:
        raise UserError(f"{out}: cannot write the run ({e.strerror or e})") from None
