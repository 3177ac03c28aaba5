"""Fixtures for the data tests: the local copy of Multi30k, when there is one."""

import gzip
import os
from pathlib import Path

import pytest

# tests/data/conftest.py -> parents[2] is the repository root; the shared copy sits beside it.
_SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    """A data folder holding ``multi30k/*.gz`` ($TRANSFORMER_DATA, else ../shared/data)."""
    for candidate in (os.environ.get("TRANSFORMER_DATA"), _SHARED_DATA):
        if candidate and (Path(candidate) / "multi30k" / "train.en.gz").is_file():
            return Path(candidate).resolve()
    pytest.skip("no local Multi30k copy: set TRANSFORMER_DATA to a folder holding multi30k/*.gz")


SAMPLE_LINES = 3000  # per language
SAMPLE_VOCAB = 1000


def _head(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        return [next(f).removesuffix("\n") for _ in range(n)]


@pytest.fixture(scope="session")
def sample(multi30k_root) -> list[str]:
    """The first lines of Multi30k train, English then German."""
    folder = multi30k_root / "multi30k"
    return _head(folder / "train.en.gz", SAMPLE_LINES) + _head(folder / "train.de.gz", SAMPLE_LINES)


@pytest.fixture(scope="session")
def subwords(sample, tmp_path_factory):
    """A joint BPE vocabulary of SAMPLE_VOCAB pieces learned on ``sample``."""
    from transformer.data import train_subwords

    return train_subwords(sample, tmp_path_factory.mktemp("spm") / "joint", vocab_size=SAMPLE_VOCAB)
