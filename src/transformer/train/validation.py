"""The scores that choose the weights a run keeps: validation at the loop's set points (rank 0),
best.safetensors whenever the score improves, patience for early stopping, and at the end the
average of the last checkpoints, kept when it has earned its place.

The task (train/task.py) scores a model (``validate``) and names its score (``score_name``:
BLEU for translation, -loss for a language model); this module only keeps the record.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..run import layout, weights
from .train_config import TrainConfig


class Validation:
    """The best score so far (``best``, -inf before the first), the evaluations since it
    improved (``bad_evals``, for ``patience``) and the step best.safetensors was last written
    at by this process (``best_step``). ``best`` and ``bad_evals`` go into every checkpoint."""

    def __init__(self, cfg: TrainConfig, task, run_dir: Path, device: torch.device, amp_dtype, log) -> None:
        self.cfg, self.task, self.run_dir, self.log = cfg, task, run_dir, log
        self.device, self.amp_dtype = device, amp_dtype
        self.best, self.bad_evals = -math.inf, 0
        self.best_step: int | None = None

    def evaluate(self, model, step: int, monitor) -> str | None:
        """Validate ``model`` at update ``step``; a better score saves best.safetensors;
        "early_stop" when patience has run out."""
        t0 = time.perf_counter()
        rec = {"event": "eval", "step": step, **self.task.validate(model, self.device, self.amp_dtype)}
        score = rec.get(self.task.score_name)
        if score is not None and score > self.best:
            self.best, self.bad_evals, rec["best"] = score, 0, True
            self.best_step = step
            weights.save_weights(model, self.run_dir / layout.BEST,
                                 {"step": str(step), self.task.score_name: f"{score:.2f}"})
        elif score is not None:
            self.bad_evals += 1
        rec["eval_seconds"] = time.perf_counter() - t0
        monitor.record(rec, step)
        self.log(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
        return "early_stop" if self.cfg.patience and self.bad_evals >= self.cfg.patience else None

    def average(self, finished: bool) -> dict:
        """Average the last ``average_last`` checkpoints into averaged.safetensors, which a run
        directory is read from first. A finished schedule keeps its average as it is (the
        recipe). The average of an unfinished one (a run the clock cut short) is scored on the
        validation set as the best checkpoint was, and kept only when it scores at least as
        well: else it is deleted and the run is read from best.safetensors. What was decided
        goes into the stop record (the returned fields)."""
        out = self.run_dir / layout.AVERAGED
        dirs = layout.checkpoint_dirs(self.run_dir)[-self.cfg.average_last:]
        weights.average_checkpoints(dirs, out)
        checkpoints = f"{len(dirs)} checkpoint{'s' * (len(dirs) != 1)}"
        if finished:
            self.log(f"averaged {checkpoints} -> {out}")
            return {}
        what = f"the average of the last {len(dirs)} checkpoints of the unfinished schedule"
        score = self.score_weights(out) if math.isfinite(self.best) else None
        if score is None:  # no validation score to hold it against
            self.log(f"averaged {checkpoints} of the unfinished schedule -> {out} "
                     "(not checked against the best checkpoint: no validation score)")
            return {}
        name, kept = self.task.score_name, score >= self.best
        if not kept:
            out.unlink(missing_ok=True)
        loads = layout.resolve_weights(self.run_dir)
        scores = (f"{self.task.score_text(score)}, {'at least' if kept else 'below'} the best checkpoint's "
                  f"{self.task.score_text(self.best)}")
        self.log(f"{what} scores {scores}: kept in {out}; the run loads it" if kept else
                 f"{what} scores {scores}: not kept; the run loads {loads}")
        return {f"averaged_{name}": score, f"best_{name}": self.best, "averaged_kept": kept, "loads": loads.name}

    def score_weights(self, path: Path) -> float | None:
        """The validation score of the weights in ``path``, as :meth:`evaluate` scores the
        model (same task, device and precision). The trained model and every RNG are left as
        they were."""
        with torch.random.fork_rng(devices=[]):  # building a model draws its initial weights (on the CPU)
            model, _ = weights.load_model(path, self.device)
        rec = self.task.validate(model, self.device, self.amp_dtype)
        return rec.get(self.task.score_name)
