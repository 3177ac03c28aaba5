"""The learning-curve picture of a run (train/plots.py)."""
from __future__ import annotations

import json
import warnings

from transformer.train.plots import plot_learning_curve


def test_a_run_stopped_before_its_first_record_plots_without_a_warning(tmp_path):
    """Ctrl-C before the first log_every: metrics.jsonl holds only the stop record, and
    matplotlib's "No artists with labels found to put in legend" reached the user's stderr."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"event": "stop", "step": 3, "reason": "SIGINT"}) + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_learning_curve(metrics, tmp_path / "learning_curve.png")
    assert out.read_bytes().startswith(b"\x89PNG")
