"""A word-for-word "language pair" for tests that train a real (toy) run: each target word
is a fixed spelling of its source word, so a toy model learns something within a few
hundred steps and its outputs depend on its inputs. Importable from every test folder
(pytest puts tests/ on the path for tests/conftest.py)."""
from __future__ import annotations

import random
from pathlib import Path

SRC_WORDS = ("red blue green small big dog cat bird man woman child runs sits eats sees plays "
             "with near under the a ball tree house car water park street").split()
TGT_OF = {w: "x" + w[::-1] for w in SRC_WORDS}


def write_corpus(folder: Path, n_train: int = 400, n_valid: int = 20, seed: int = 0) -> dict[str, Path]:
    """Write train/valid .src/.tgt files (one sentence a line) and return their paths."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        sents = [[rng.choice(SRC_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        for side, text in (("src", [" ".join(s) for s in sents]),
                           ("tgt", [" ".join(TGT_OF[w] for w in s) for s in sents])):
            path = folder / f"{split}.{side}"
            path.write_text("".join(t + "\n" for t in text), encoding="utf-8")
            paths[f"{split}_{side}"] = path
    return paths
