"""Fixtures for the data tests: the local copy of Multi30k, when there is one."""

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
