"""What a run reports while it trains: metrics.jsonl (one JSON object a line), TensorBoard
when asked for, the progress bar, and the learning-curve picture at the end. Rank 0 alone
writes; on other ranks every method does nothing."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ..errors import UserError
from ..extras import require
from ..run.files import open_to_append
from ..run.layout import CURVE, METRICS
from .update import StepStats


def require_tensorboard() -> None:
    """MissingExtra (one line naming the extra) when the tensorboard package is absent.
    torch.utils.tensorboard needs it; checked first, as its own ImportError names neither."""
    require("tensorboard", "tensorboard", "tensorboard=true")


def ended_at(run_dir: Path, step: int) -> bool:
    """Whether the last ``stop`` record in RUN_DIR/metrics.jsonl says the run ended at ``step``
    by its schedule or its clock: its end (final evaluation, checkpoint, average) is then
    written already. A signal's stop skips the final evaluation and the average."""
    try:
        lines = (Path(run_dir) / METRICS).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "stop":
            return rec.get("step") == step and rec.get("reason") not in ("SIGINT", "SIGTERM")
    return False


class Monitor:
    def __init__(self, run_dir: Path, *, active: bool, progress: bool, tensorboard: bool, log_every: int,
                 log=print) -> None:
        self.run_dir, self.active, self.log, self.log_every = Path(run_dir), active, log, log_every
        self.want_progress, self.want_tensorboard = progress and active, tensorboard and active
        self.bar = self.writer = None
        self._tokens, self._since = 0, time.perf_counter()

    def start(self, step: int, max_steps: int) -> None:
        """Open the progress bar and TensorBoard writer (at the first update of this process)."""
        if self.want_tensorboard:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        if self.want_progress:
            from tqdm import tqdm

            self.bar = tqdm(total=max_steps, initial=step, unit="step", dynamic_ncols=True, mininterval=1.0)
        self._tokens, self._since = 0, time.perf_counter()

    def record(self, rec: dict, step: int) -> None:
        """Append one record to metrics.jsonl (and its numbers to TensorBoard)."""
        if not self.active:
            return
        try:
            with open_to_append(self.run_dir / METRICS) as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            raise UserError(f"{self.run_dir / METRICS}: cannot write ({e.strerror or e})") from None
        if self.writer is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, rec.get("step", step))

    def update(self, step: int, epoch: int, stats: StepStats, train_minutes: float, **extra) -> None:
        """After each update: the bar moves; every ``log_every`` updates a training record
        with the tokens per second since the last one."""
        self._tokens += stats.n_tokens
        if self.bar is not None:
            self.bar.update(1)
        if step % self.log_every:
            return
        now = time.perf_counter()
        tps = self._tokens / max(now - self._since, 1e-9)
        self.record({"step": step, "epoch": epoch, "loss": stats.loss, "nll": stats.nll,
                     "ppl": math.exp(min(stats.nll, 50)), "lr": stats.lr, "grad_norm": stats.grad_norm,
                     "tgt_tokens_per_s": tps, "train_minutes": train_minutes, **extra}, step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{tps:,.0f}", lr=f"{stats.lr:.2e}")
        self._tokens, self._since = 0, now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def finish(self) -> None:
        """At the end of a run: the learning curve (a failure only warns: it must never lose a
        finished run) and the TensorBoard file closed."""
        if not self.active:
            return
        from .plots import plot_learning_curve

        try:
            plot_learning_curve(self.run_dir / METRICS, self.run_dir / CURVE)
        except Exception as e:  # noqa: BLE001
            self.log(f"warning: could not draw the learning curve ({e})")
        if self.writer is not None:
            self.writer.close()
