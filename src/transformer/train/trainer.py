"""The training loop: the paper's optimizer and schedule, label smoothing, gradient
accumulation, mixed precision, a clean stop on Ctrl-C / SIGTERM, and data-parallel training
over the ranks torchrun starts (see train/distributed.py: every rank trains, rank 0 alone
writes files and validates, and every decision to stop is taken by all ranks together).

:meth:`Trainer.train` is the recipe in one screen. Its other jobs are pieces of their own:

    what it trains on       a task (train/task.py): the model, batches and validation
    the scores it keeps     :class:`~transformer.train.validation.Validation`: best weights,
                            early stopping, the checked average of the last checkpoints
    checkpoints             :class:`~transformer.train.checkpoint.Checkpoints`: save, resume exactly
    the run directory       train/run_dir.py: checked before it changes, undone if set-up fails
    what it reports         a Monitor (train/monitor.py)

Within an update nothing is read back from the device (a read makes a GPU finish its queue of
kernels first): train_step leaves its figures there and skips a non-finite update there. The
loop reads them every ``log_every`` updates, and before an evaluation, a checkpoint or the end,
and only then learns which updates were skipped (:meth:`Trainer._take_stock`).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
from pathlib import Path

import torch

from ..errors import UserError
from ..hardware import device_line, resolve_device, slow_precision_warning
from ..model.dropout import Dropout
from ..run import layout
from ..run.lock import RunLock, lock_run
from .checkpoint import Checkpoints, seed_all
from .train_config import TrainConfig
from .distributed import Dist
from .loss import compile_loss
from .monitor import Monitor, ended_at, require_tensorboard
from .prepare import PreparedData, PreparedText, data_checksums, prepare_data, prepare_run
from .reuse import Start
from .run_dir import check_run_dir, refuse_inside_checkpoints, undone_if_it_fails
from .schedule import dropout_ramp, lr_at
from .auto_precision import choose_precision
from .update import StepStats, finite_in_fp32, forward_loss, make_optimizer, read_back, train_step
from .task import make_task
from .validation import Validation

SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}


def _quiet(*args, **kwargs) -> None:  # noqa: ARG001 - the log of ranks other than 0
    return None


class Trainer:
    """Args:
        cfg: the training config.
        run_dir: where the run lives; a directory holding a checkpoint is resumed.
        device: "auto" (a CUDA GPU when there is one), "cpu" or "cuda[:N]" for a single process
            (ignored when ``dist`` is given).
        log: where progress lines go (rank 0 only).
        dist: this process's place in a torchrun group (:func:`distributed.from_env`).

    Rank 0 holds the run's writer lock (run/lock.py) from before it changes anything in
    ``run_dir`` until :meth:`train` returns (or the set-up fails): a second Trainer on the
    same run, in any process, stops at once with a UserError naming the holder's pid.
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, device: str = "auto", log=print,
                 dist: Dist | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.dist = dist or Dist(device=torch.device(resolve_device(device)))
        self.device = self.dist.device
        self.log = log if self.dist.is_main else _quiet
        self.stop_signal: str | None = None
        if cfg.tensorboard:  # before the data is prepared, and on every rank, so that all stop
            require_tensorboard()
        refuse_inside_checkpoints(self.run_dir)
        made = not self.run_dir.exists()
        self._lock: RunLock | None = None
        self.dist.on_main(self._take_lock)  # one writer per run, before anything in it changes
        try:
            with undone_if_it_fails(self.run_dir, self.dist.is_main):  # bad input leaves no half-made run behind
                self._set_up()
        except BaseException:
            self.release()
            if made and self.dist.is_main:  # the folder the lock made, now empty again
                with contextlib.suppress(OSError):
                    self.run_dir.rmdir()
            raise

    def _take_lock(self) -> None:
        self._lock = lock_run(self.run_dir, "transformer train")

    def release(self) -> None:
        """Let another ``transformer train`` write this run (done when :meth:`train` returns)."""
        if self._lock is not None:  # None: not the main process, or a system without locks
            self._lock.release()  # (a released lock releases again as a no-op)

    def _set_up(self) -> None:
        cfg = self.cfg
        check_run_dir(self.run_dir, cfg)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed_all(cfg.seed)
        self.start = Start.resolve(cfg, self.run_dir)  # init_from / subwords_from, read and checked
        self.data: PreparedData | PreparedText | None = None
        self.checkpoints = Checkpoints(cfg, self.run_dir, self.dist, self.log)
        self.dist.on_main(self._prepare_run_dir)  # rank 0 learns the subwords and writes config.yaml ...
        if self.data is None:  # ... and the other ranks then read them
            self.data = prepare_data(cfg, self.run_dir, self._max_len(), _quiet)
        # translation pairs or a language model's text
        self.task = make_task(cfg, self.data, self.dist, self.start.model_config)
        self.sampler = self.task.sampler
        self.model = self.task.build_model()  # the same seed on every rank: the same weights
        self.start.initialise(self.model, getattr(self.data, "subwords", None), self.log)  # a new run only
        self.model = self.model.to(self.device)
        if self.dist.rank:
            seed_all(cfg.seed + self.dist.rank)  # but each rank its own dropout masks
        self.optimizer = make_optimizer(self.model, cfg.optimizer, cfg.weight_decay, cfg.betas)
        # auto on a CPU with native bf16: bf16 or fp32, whichever measured faster (train/auto_precision.py)
        self.amp_dtype = choose_precision(cfg, self.model, self.task, self.device, self.dist.world_size, self.log)
        if note := slow_precision_warning(cfg.precision, self.device):
            self.log(f"warning: {note}")
        # fp16's range needs loss scaling on every device (its small gradients flush to zero), the CPU too
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None
        self.loss_kernels = self._loss_kernels()
        self.validation = Validation(cfg, self.task, self.run_dir, self.device, self.amp_dtype, self.log)
        self.step, self.bad_steps, self.elapsed = 0, 0, 0.0
        self.unread: list = []  # (StepStats on the device, epoch) of the updates not read back yet
        self.last_micro: list = []
        self.checkpoints.resume(self.model, self._restore)
        self.dist.on_main(lambda: self.checkpoints.repair_metrics(self.step))
        self.forward, self.loss_fn = self._compiled(self._wrap())
        self.monitor = Monitor(self.run_dir, active=self.dist.is_main, progress=cfg.progress,
                               tensorboard=cfg.tensorboard, log_every=cfg.log_every, log=self.log)
        ranks = f" (and {self.dist.world_size - 1} more processes)" if self.dist.world_size > 1 else ""
        precision = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast"}[self.amp_dtype]
        self.log(f"device: {device_line(self.device)}{ranks}; precision {precision}")
        self.log(self.task.batch_summary(self.dist.world_size, cfg.accum_steps))

    # ---- the loop ---------------------------------------------------------------------
    def train(self) -> dict:
        """Train until max_steps / max_epochs / max_minutes / early stopping / a signal:
        batches -> train_step -> schedule, with evaluation, checkpoints and logging at their
        set points. A run that ended (not by a signal) resumed at or past max_steps trains
        nothing and writes nothing (as fairseq's max_update): raise max_steps to train further."""
        c, reason = self.cfg, "max_steps"
        try:
            if self.step >= c.max_steps and self.dist.on_main(lambda: ended_at(self.run_dir, self.step)):
                self.log(f"already at step {self.step} >= max_steps {c.max_steps}: nothing to train "
                         "(raise max_steps to train further)")
                return {"step": self.step, "reason": reason, "finished": True, "best_bleu": self.best_bleu,
                        "train_minutes": self.elapsed / 60}
            batches = self.task.batches(self.model, self.device)
            with self._signals_stop_the_run(), contextlib.closing(self.monitor):
                self.monitor.start(self.step, c.max_steps)
                while self.step < c.max_steps:
                    t0 = time.perf_counter()  # the clock counts making the batches too
                    micro = list(itertools.islice(batches, c.accum_steps))
                    if not micro:  # every rank has the same number of batches an epoch
                        reason = "max_epochs"
                        break
                    stats = self.update(micro)
                    read = self._count(stats, micro)  # and the wait for the device, when it is read
                    self.elapsed += time.perf_counter() - t0
                    early_stop = self._after_update(read)
                    stop = self._agreed_stop(early_stop)
                    if stop:
                        reason = stop
                        break
            return self._finish(reason)
        finally:
            self.release()  # after the last file is written

    def update(self, micro: list) -> StepStats:
        """One optimizer update over the micro-batches, at the schedule's learning rate (and
        dropout, with dropout_ramp) for update ``step + 1``."""
        c = self.cfg
        self.model.train()
        if c.dropout_ramp:
            self._set_dropout(self.step + 1)
        return train_step(self.model, micro, self.optimizer, self.lr(self.step + 1), epsilon=c.label_smoothing,
                          clip_norm=c.clip_norm or None, amp_dtype=self.amp_dtype, grad_scaler=self.scaler,
                          forward=self.forward, loss_kernels=self.loss_kernels, loss_fn=self.loss_fn)

    def _count(self, stats: StepStats, micro: list) -> list | None:
        """Count the update, for now: its figures stay on the device until a read-back is due
        (every ``log_every`` updates, and before an evaluation, a checkpoint or the last update),
        so that the device never waits for the host within an update. Then the unread
        updates' figures come back at once (:func:`read_back`): the update-entries to go through."""
        self.step += 1
        self.unread.append((stats, self.sampler.state_dict()["epoch"]))
        self.last_micro = micro
        c, s = self.cfg, self.step
        if s % c.log_every and s % c.eval_every and s % c.save_every and s < c.max_steps:
            return None
        return self._read_unread()

    def _read_unread(self) -> list:
        """The unread updates' (figures as Python numbers, epoch), in one read from the device."""
        unread, self.unread = self.unread, []
        return [(read, epoch) for read, (_, epoch) in zip(read_back([u for u, _ in unread]), unread)]

    def _after_update(self, read: list | None) -> bool:
        """After a read-back: log, evaluate and save at their set points; True when evaluation
        says to stop early."""
        if read is None:
            return False
        self._take_stock(read)
        c = self.cfg
        early_stop = self.step % c.eval_every == 0 and self.evaluate() == "early_stop"
        if self.step % c.save_every == 0:
            self.save()
        return early_stop

    def _take_stock(self, read: list) -> None:
        """Go through the updates just read back, in order: a made update is counted for good
        and logged at its set points; a skipped one (a non-finite loss or gradient: the device
        left the weights alone) gives its number back, since a step is an update made, and is
        recorded; every rank sees the same, as train_step all-reduces the verdict. Then, if the
        last update was skipped, whether the weights themselves are broken, and whether
        ``max_bad_steps`` updates in a row were skipped."""
        c = self.cfg
        step, longest = self.step - len(read), 0
        for stats, epoch in read:
            if stats.skipped:
                self.bad_steps += 1
                longest = max(longest, self.bad_steps)
                self.monitor.record({"event": "skipped_step", "step": step, "loss": stats.loss}, step)
                continue
            self.bad_steps = 0
            step += 1
            extra = {"dropout": self._dropout(step)} if c.dropout_ramp else {}
            self.monitor.update(step, epoch, stats, self.elapsed / 60, **extra)
        self.step = step
        if self.bad_steps and self.dist.any([int(not finite_in_fp32(self.model, self.last_micro))])[0]:
            self._broken_weights()
        if longest >= c.max_bad_steps:
            saved = self.save()  # skipped updates leave the weights as they were: good
            raise UserError(f"{longest} consecutive updates had a non-finite loss or gradient; stopping. "
                            f"The last good checkpoint is {saved}; try a lower learning rate or precision=fp32")

    def _broken_weights(self) -> None:
        """Stop without saving: update ``step`` made weights whose loss or gradient is not
        finite even in fp32 without dropout (an absurd learning rate), which no later update
        repairs. A checkpoint of that step, already written, holds them: it is set aside
        (checkpoints/corrupt-step-*), so that a resume starts from the one before; a
        best.safetensors of that step (a broken model may score a first BLEU of 0) is deleted."""
        newest = layout.latest_checkpoint(self.run_dir)
        if newest is not None and self.checkpoints.saved_step == self.step and self.dist.is_main:
            with contextlib.suppress(OSError):
                layout.set_aside(newest)
            newest = layout.latest_checkpoint(self.run_dir)
        if self.validation.best_step == self.step and self.dist.is_main:
            (self.run_dir / layout.BEST).unlink(missing_ok=True)
        good = f"the last good checkpoint is {newest}" if newest is not None else "no good checkpoint is left"
        what = (f"update {self.step} (learning rate {self.lr(self.step):.3g}) made the weights unusable"
                if self.step else "the initial weights are unusable")
        rate = "lr_scale" if self.cfg.lr_schedule == "noam" else "peak_lr"
        raise UserError(f"{what}: their loss or gradient is not finite even in fp32; stopped without saving them, "
                        f"and {good}. Start again with a lower {rate} (a new --out: a run keeps its schedule)")

    def _finish(self, reason: str) -> dict:
        """The last evaluation (before the last save, so that the checkpoint holds its score:
        a resumed run must not take a worse model for the best one), the last checkpoint,
        the average of the last checkpoints, the stop record and the learning curve."""
        c = self.cfg
        if self.unread:  # a stop between read-backs: a signal, the clock, the end of the data
            t0 = time.perf_counter()
            read = self._read_unread()
            self.elapsed += time.perf_counter() - t0
            self._take_stock(read)
        interrupted = reason in ("SIGINT", "SIGTERM")
        final_eval = not interrupted and self.task.has_validation and self.step % c.eval_every != 0
        if final_eval:
            self.evaluate()
        if final_eval or self.checkpoints.saved_step != self.step:
            self.save()
        # the schedule ran to its end: max_steps, max_epochs or early stopping, not a signal
        # nor the clock (unless the clock ran out at max_steps itself)
        finished = not interrupted and (reason != "max_minutes" or self.step >= c.max_steps)
        result = {"step": self.step, "reason": reason, "finished": finished, "best_bleu": self.best_bleu,
                  "train_minutes": self.elapsed / 60}
        if not self.dist.is_main:
            return result
        stop = {"event": "stop", "step": self.step, "reason": reason, "finished": finished,
                "train_minutes": self.elapsed / 60}
        if not finished and not interrupted:
            self.log(f"stopped by max_minutes ({c.max_minutes:g}) at update {self.step} of {c.max_steps}: the "
                     "schedule did not finish; raise max_minutes to train the recipe's model")
        if not interrupted and c.average_last > 1:
            stop.update(self.validation.average(finished))
        self.monitor.record(stop, self.step)
        self.monitor.finish()
        self.log(f"stopped at step {self.step} ({reason}); {self.elapsed / 60:.1f} training minutes; "
                 f"{self.task.best_summary(self.best_bleu)}")
        return result

    # ---- schedule ---------------------------------------------------------------------
    def lr(self, step: int) -> float:
        return lr_at(self.cfg, self.model.cfg.d_model, step)

    def _dropout(self, step: int) -> float:
        return dropout_ramp(step, self.cfg.dropout_start, self.model.cfg.dropout, self.cfg.dropout_ramp)

    def _set_dropout(self, step: int) -> None:
        """The ramped dropout for update ``step`` on every P_drop site (embeddings and
        sub-layer outputs; attention-weight dropout keeps model.attn_dropout). A function of
        the step alone, so a resumed run continues exactly and every rank agrees."""
        p = self._dropout(step)
        for m in self.model.modules():
            if isinstance(m, Dropout):
                m.p = p

    # ---- validation and checkpoints ---------------------------------------------------
    @property
    def best_bleu(self) -> float:
        """The best validation score so far (the task's ``score_name``; -inf before the first)."""
        return self.validation.best

    @best_bleu.setter
    def best_bleu(self, score: float) -> None:
        self.validation.best = score

    def evaluate(self) -> str | None:
        """Validation on rank 0 with the unwrapped model (the other ranks wait); a better
        score saves best.safetensors; "early_stop" when patience has run out."""
        if not self.task.has_validation or not self.dist.is_main:
            return None
        return self.validation.evaluate(self.model, self.step, self.monitor)

    def save(self) -> Path:
        """Write a checkpoint (rank 0; every rank must call this: it gathers their RNG states)."""
        return self.checkpoints.save(self.model, self.step, {
            "step": self.step, "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
            "best_bleu": self.validation.best, "bad_evals": self.validation.bad_evals, "elapsed": self.elapsed,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None})

    def _restore(self, state: dict) -> int:
        """What :meth:`save` wrote, put back (the weights are loaded already)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step, self.validation.best = state["step"], state["best_bleu"]
        self.validation.bad_evals, self.elapsed = state["bad_evals"], state["elapsed"]
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        return self.step

    # ---- stopping ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _signals_stop_the_run(self):
        """Ctrl-C and SIGTERM end the run after the update in flight (and its checkpoint)."""
        def on_signal(signum, frame) -> None:  # noqa: ARG001
            self.stop_signal = signal.Signals(signum).name

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _agreed_stop(self, early_stop: bool) -> str | None:
        """Why to stop now, the same answer on every rank (a signal or the clock may reach
        one rank first; rank 0 alone validates)."""
        c = self.cfg
        over_time = bool(c.max_minutes) and self.elapsed >= c.max_minutes * 60
        early, sig, over = self.dist.any([int(early_stop), SIGNAL_CODES.get(self.stop_signal or "", 0), int(over_time)])
        if early:
            return "early_stop"
        if sig:
            return {v: k for k, v in SIGNAL_CODES.items()}[sig]
        return "max_minutes" if over else None

    # ---- set-up -----------------------------------------------------------------------
    def _max_len(self) -> int:
        return self.start.model_config(vocab_size=max(self.cfg.vocab_size, 8)).max_len

    def _prepare_run_dir(self) -> None:
        self.data = prepare_run(self.cfg, self.run_dir, self._max_len(), self.log, self.start.subwords,
                                self.start.tokenizer_files)
        self.checkpoints.data_sha256 = json.dumps(data_checksums(self.cfg))  # each checkpoint records it

    def _loss_kernels(self):
        if not (self.cfg.compile_loss and self.device.type == "cpu"):
            return None
        kernels = compile_loss(dtype=self.amp_dtype or torch.float32)
        if kernels is not None:
            self.log("loss: compiled kernels (compile_loss: true)")
        return kernels

    def _compiled(self, wrapper):
        """The forward train_step runs (the DDP wrapper, else None: the model) and its loss
        function; with ``compile: true`` both compiled at the window's fixed shape
        (train/torch_compile.py). Validation and decoding stay eager."""
        if not self.cfg.compile:
            return wrapper, forward_loss
        from .torch_compile import compiled_training

        self.log("model: the training forward, loss and backward compiled by torch.compile (compile: true)")
        return compiled_training(self.model, wrapper, cpu=self.device.type == "cpu")

    def _wrap(self):
        """The DistributedDataParallel wrapper train_step runs forward through (None: one process)."""
        if not self.dist.enabled:
            return None
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # The only buffer is the constant positional-encoding table: nothing to sync each step.
        return DistributedDataParallel(self.model, device_ids=ids, forward_sync_buffers=False)
