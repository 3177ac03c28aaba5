"""A made-up text for the language-model tests (a module of its own: test files import it
by name, which ``from conftest import`` cannot do safely under xdist)."""
from __future__ import annotations

import random

WORDS = "the a cat dog sat ran on under mat log and then quickly slowly".split()


def make_text(n_lines: int = 120, seed: int = 0) -> str:
    """Short made-up sentences, one a line: enough structure for the loss to fall fast."""
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + ".\n" for _ in range(n_lines))
