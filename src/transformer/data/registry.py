"""Known datasets: where their files live locally and where to download them from.

The data folder is resolved by :func:`find_data_dir` (option > ``$TRANSFORMER_DATA`` >
``~/.cache/transformer/data``); a dataset keeps its files in a sub-folder named after it,
e.g. ``<data_dir>/multi30k/train.de.gz`` or ``<data_dir>/tinyshakespeare/input.txt``. Local files
are used as they are; a missing file is downloaded (when allowed) into a temporary file a chunk
at a time, stopped once it passes the file's published size, checked against the SHA-256 in
:data:`MULTI30K` or :data:`TINY_SHAKESPEARE`, and only then moved into place, so the folder
never holds a partial or corrupt download and a download never holds more than a chunk in memory.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..run.files import atomic_write, home_cache
from .corpus import read_lines, read_parallel

__all__ = ["Dataset", "MULTI30K", "TextFile", "TINY_SHAKESPEARE", "DATA_ENV_VAR", "find_data_dir", "load_multi30k",
           "tinyshakespeare_path", "fetch_url", "load_multi30k_text", "multi30k_path"]

DATA_ENV_VAR = "TRANSFORMER_DATA"

Fetch = Callable[[str], "Iterable[bytes] | bytes"]
"""Downloads a URL and gives its bytes in chunks (or all at once); raises on failure. Injected by tests."""

CHUNK = 1 << 16  # bytes read from the network at a time
MAX_DOWNLOAD = 1 << 30  # a download whose size nothing publishes stops here (the largest known file: 1.1 MB)


@dataclass(frozen=True)
class Dataset:
    """A parallel corpus published as one gzip file per split and language.

    Attributes:
        name: folder name under the data directory.
        splits: valid split names.
        langs: valid language codes.
        url: download URL template with ``{split}`` and ``{lang}`` fields.
        sha256: expected SHA-256 of each file, keyed by its file name.
        sizes: each file's size in bytes (a download that passes it is stopped).
        line_counts: sentences per split (the same for every language).
    """

    name: str
    splits: tuple[str, ...]
    langs: tuple[str, ...]
    url: str
    sha256: dict[str, str]
    sizes: dict[str, int]
    line_counts: dict[str, int]

    @staticmethod
    def file_name(split: str, lang: str) -> str:
        """The file name of one side of a split, e.g. ``train.de.gz``."""
        return f"{split}.{lang}.gz"


MULTI30K = Dataset(
    name="multi30k",
    splits=("train", "val", "test_2016_flickr"),
    langs=("en", "de", "fr", "cs"),
    url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz",
    sha256={
        "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
        "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
        "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
        "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
        "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
        "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
        "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
        "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
        "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
        "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
        "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
        "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    },
    sizes={
        "train.en.gz": 568929, "train.de.gz": 637044, "train.fr.gz": 604242, "train.cs.gz": 593827,
        "val.en.gz": 21650, "val.de.gz": 24681, "val.fr.gz": 23001, "val.cs.gz": 22096,
        "test_2016_flickr.en.gz": 21077, "test_2016_flickr.de.gz": 22890, "test_2016_flickr.fr.gz": 22310,
        "test_2016_flickr.cs.gz": 22572,
    },
    line_counts={"train": 29000, "val": 1014, "test_2016_flickr": 1000},
)


@dataclass(frozen=True)
class TextFile:
    """A plain-text corpus published as one file: ``<data_dir>/<name>/<file_name>``."""

    name: str
    file_name: str
    url: str
    sha256: str
    size: int  # bytes


# The 1,115,394 characters nanoGPT's shakespeare_char trains on (Karpathy's char-rnn data).
TINY_SHAKESPEARE = TextFile(
    name="tinyshakespeare",
    file_name="input.txt",
    url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    size=1115394,
)


def find_data_dir(data_dir: str | Path | None = None) -> Path | None:
    """The data folder: ``data_dir`` if given, else ``$TRANSFORMER_DATA`` if set and non-empty,
    else ``~/.cache/transformer/data``; ``None`` only when no home directory can be found.

    The folder need not exist yet (downloads create it).
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return home_cache("data")


def fetch_url(url: str, timeout: float = 60.0, limit: int = MAX_DOWNLOAD) -> Iterator[bytes]:
    """Download ``url`` over HTTP(S), giving its bytes in chunks of at most :data:`CHUNK`
    (read them into a file: a whole download is never held in memory).

    Raises:
        UserError: the download failed (no network, HTTP error, timeout), or passed ``limit``
            bytes (the connection is closed there).
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            got = 0
            while chunk := response.read(CHUNK):
                got += len(chunk)
                if got > limit:
                    raise UserError(f"could not download {url} (it passed {limit:,} bytes, more than any file "
                                    "this downloads; stopped there)")
                yield chunk
    except (urllib.error.URLError, OSError) as e:
        raise UserError(
            f"could not download {url} ({getattr(e, 'reason', e)}); check the network"
        ) from e


def _download(dataset: Dataset, split: str, lang: str, folder: Path, fetch: Fetch) -> Path:
    """Fetch one file, verify its SHA-256, then move it into ``folder`` atomically."""
    name = dataset.file_name(split, lang)
    return _fetch_verified(dataset.url.format(split=split, lang=lang), dataset.sha256[name], dataset.sizes[name],
                           folder / name, fetch)


def _fetch_verified(url: str, expected: str, size: int, target: Path, fetch: Fetch) -> Path:
    """Fetch ``url`` into a temporary file beside ``target`` a chunk at a time, stopping once
    it passes ``size`` bytes (the file's published size), check its SHA-256 against
    ``expected``, then move it to ``target``; on any failure nothing is left."""
    def write(tmp: str) -> None:
        digest, got = hashlib.sha256(), 0
        with closing(_chunks(fetch, url, target)) as chunks, open(tmp, "wb") as f:
            for chunk in chunks:
                got += len(chunk)
                if got > size:  # (closing the chunks closes the connection)
                    raise UserError(f"could not download {url}: it passed {size:,} bytes, the size of the published "
                                    f"file, and was stopped there; retry, or place a verified copy at {target}")
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != expected:
            raise UserError(
                f"checksum mismatch for {url}: expected sha256 {expected}, got {digest.hexdigest()}; "
                f"the download is corrupt or changed upstream: retry, or place a verified copy at {target}"
            )

    atomic_write(target, write)  # a crash, a stop or a mismatch never leaves half a file
    return target


def _chunks(fetch: Fetch, url: str, target: Path) -> Iterator[bytes]:
    """``fetch(url)``'s chunks; its one-line error names where a copy made by hand goes."""
    try:
        chunks = fetch(url)
        yield from (chunks,) if isinstance(chunks, bytes) else chunks
    except UserError as e:
        raise UserError(f"{e}, or place the file at {target}") from e


def _check_choice(kind: str, value: str, valid: tuple[str, ...], dataset: Dataset) -> None:
    if value not in valid:
        raise UserError(f"unknown {dataset.name} {kind} {value!r}; choose one of: {', '.join(valid)}")


def load_multi30k(
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | Path | None = None,
    download: bool = True,
    fetch: Fetch | None = None,
) -> list[tuple[str, str]]:
    """Load one Multi30k split as ``(source, target)`` sentence pairs.

    Looks in ``<data_dir>/multi30k/`` first (``data_dir`` resolved by :func:`find_data_dir`);
    files found there are used as they are. Missing files are downloaded into that folder
    when ``download`` is true and verified against their published SHA-256.

    Args:
        split: ``"train"``, ``"val"`` or ``"test_2016_flickr"``.
        src_lang, tgt_lang: two different codes among ``en, de, fr, cs``.
        data_dir: explicit data folder; see :func:`find_data_dir`.
        download: fetch missing files; if false a missing file is an error.
        fetch: function ``url -> bytes`` used to download (default :func:`fetch_url`).

    Raises:
        UserError: unknown split or language, missing file with ``download=False``,
            failed download, checksum mismatch, or a malformed file.
    """
    _check_choice("split", split, MULTI30K.splits, MULTI30K)
    for lang in (src_lang, tgt_lang):  # every choice checked before any file is looked for
        _check_choice("language", lang, MULTI30K.langs, MULTI30K)
    if src_lang == tgt_lang:
        raise UserError(f"source and target language are both {src_lang!r}; choose two different languages")
    paths = [multi30k_path(split, lang, data_dir, download, fetch) for lang in (src_lang, tgt_lang)]
    return read_parallel(*paths)


def load_multi30k_text(split: str, lang: str, data_dir: str | Path | None = None, download: bool = True,
                       fetch: Fetch | None = None) -> str:
    """One language's side of a Multi30k split as a text, one sentence a line (a language
    model's corpus: ``dataset: multi30k-mono``). Found or downloaded as :func:`load_multi30k`."""
    return "".join(line + "\n" for line in read_lines(multi30k_path(split, lang, data_dir, download, fetch)))


def multi30k_path(split: str, lang: str, data_dir: str | Path | None = None, download: bool = True,
                  fetch: Fetch | None = None) -> Path:
    """The local path of one Multi30k file (``<data_dir>/multi30k/<split>.<lang>.gz``),
    downloaded and verified first when missing and ``download`` is true."""
    dataset = MULTI30K
    _check_choice("split", split, dataset.splits, dataset)
    _check_choice("language", lang, dataset.langs, dataset)
    root = find_data_dir(data_dir)
    if root is None:
        raise UserError(f"no data folder: pass a data directory or set ${DATA_ENV_VAR}")
    folder = root / dataset.name
    path = folder / dataset.file_name(split, lang)
    if path.exists():
        return path
    if not download:
        raise UserError(f"{path}: not found and downloading is off; allow downloading or place the "
                        f"{dataset.name} files in {folder}")
    return _download(dataset, split, lang, folder, fetch or fetch_url)


def tinyshakespeare_path(data_dir: str | Path | None = None, download: bool = True, fetch: Fetch | None = None) -> Path:
    """The path of Tiny Shakespeare: ``<data_dir>/tinyshakespeare/input.txt`` (``data_dir``
    resolved by :func:`find_data_dir`), used as it is when present; else downloaded from
    :data:`TINY_SHAKESPEARE`'s URL and verified against its SHA-256 (when ``download``).

    Raises:
        UserError: missing with ``download=False``, failed download or checksum mismatch.
    """
    root = find_data_dir(data_dir)
    if root is None:
        raise UserError(f"no data folder: pass a data directory or set ${DATA_ENV_VAR}")
    ds = TINY_SHAKESPEARE
    path = root / ds.name / ds.file_name
    if path.exists():
        return path
    if not download:
        raise UserError(f"{path}: not found and downloading is off; allow downloading or place {ds.url} there")
    return _fetch_verified(ds.url, ds.sha256, ds.size, path, fetch or fetch_url)
