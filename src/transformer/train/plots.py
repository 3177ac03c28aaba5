"""The learning-curve picture of a run (training loss, validation loss and BLEU by step)."""
from __future__ import annotations

import json
from pathlib import Path

from ..run.files import atomic_write


def plot_learning_curve(metrics: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics).read_text(encoding="utf-8").splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows if "event" not in r and "loss" in r]
    valid = [(r["step"], r["valid_nll"]) for r in rows if r.get("event") == "eval"]
    bleu = [(r["step"], r["valid_bleu"]) for r in rows if r.get("event") == "eval" and "valid_bleu" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if train:
        ax.plot(*zip(*train), label="training loss (label-smoothed)", lw=1)
    if valid:
        ax.plot(*zip(*valid), "o-", label="validation NLL", lw=1.5)
    ax.set_xlabel("update")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    if bleu:
        ax2 = ax.twinx()
        ax2.plot(*zip(*bleu), "s-", color="tab:green", label="validation BLEU (greedy)")
        ax2.set_ylabel("BLEU")
        ax2.legend(loc="center right")
    if train or valid:  # a run stopped before its first record has nothing to label (matplotlib warns)
        ax.legend(loc="upper right")
    ax.set_title(f"learning curve: {Path(metrics).parent.name}")
    fig.tight_layout()
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
    return Path(out)
