"""The tiny Hugging Face folders the import tests read: each family's built once a session."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def hf_folders(tmp_path_factory):
    """family -> a tiny checkpoint folder (hf_checkpoints.build_checkpoint; "marian":
    test_marian_import.build_marian, one vocabulary), built when first asked for and shared
    by every test: a test that changes one changes a copy of it (:func:`hf_checkpoints.copy_folder`)."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            from hf_checkpoints import build_checkpoint
            from test_marian_import import build_marian

            root = tmp_path_factory.mktemp(family)
            made[family] = (build_marian(root, shared=True) if family == "marian"
                            else build_checkpoint(family, root / "hf")[0])
        return made[family]
    return get
