"""Options shared by several commands (a leading underscore: not a command module)."""
from __future__ import annotations

import argparse

from ..decode.precision import PRECISIONS


def add_precision_option(p: argparse.ArgumentParser) -> None:
    """``--precision`` of translate, evaluate and serve. No argparse ``choices``: a bad value
    is checked when the model is loaded and reported as one line, without the usage."""
    p.add_argument("--precision", default="fp32",
                   help=f"CPU decoding arithmetic, one of {', '.join(PRECISIONS)}: bf16 weights or int8 weight-only "
                        "quantisation (faster; BLEU cost measured in benchmarks/decode/README.md)")
