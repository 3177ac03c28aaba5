"""The training loop: the paper's optimizer and schedule, label smoothing, gradient
accumulation, mixed precision, validation, early stopping, checkpoints that resume
exactly, a clean stop on Ctrl-C / SIGTERM, and data-parallel training over the ranks
torchrun starts (see train/distributed.py: every rank trains, rank 0 alone writes files and
validates, and every decision to stop is taken by all ranks together).

:meth:`Trainer.train` is the recipe in one screen; what it trains on is a task
(train/task.py), and what it reports goes through a Monitor (train/monitor.py).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..model.dropout import Dropout
from ..run import files, layout, weights
from ..run.lock import RunLock, lock_run, make_run_dir
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Dist, reshard_position
from .loss import compile_loss
from .monitor import Monitor, ended_at, require_tensorboard
from .prepare import DATA_FILES, PreparedData, PreparedText, data_checksums, prepare_data, prepare_run, tokenizer_file
from .reuse import Start
from .schedule import dropout_ramp, lr_at
from ..hardware import slow_precision_warning
from .step import StepStats, finite_in_fp32, forward_loss, make_optimizer, resolve_precision, train_step
from .task import make_task

SIGNAL_CODES = {"SIGINT": 1, "SIGTERM": 2}
DATA_SHA256 = "data_sha256"  # a checkpoint's record of its data files' checksums, by key (prepare.data_checksums)


def _quiet(*args, **kwargs) -> None:  # noqa: ARG001 - the log of ranks other than 0
    return None


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Trainer:
    """Args:
        cfg: the training config.
        run_dir: where the run lives; a directory holding a checkpoint is resumed.
        device: "cpu" or "cuda[:N]" for a single process (ignored when ``dist`` is given).
        log: where progress lines go (rank 0 only).
        dist: this process's place in a torchrun group (:func:`distributed.from_env`).

    Rank 0 holds the run's writer lock (run/lock.py) from before it changes anything in
    ``run_dir`` until :meth:`train` returns (or the set-up fails): a second Trainer on the
    same run, in any process, stops at once with a UserError naming the holder's pid.
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, device: str = "cpu", log=print,
                 dist: Dist | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.dist = dist or Dist(device=torch.device(device))
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
        _seed_all(cfg.seed)
        self.start = Start.resolve(cfg, self.run_dir)  # init_from / subwords_from, read and checked
        self.data: PreparedData | PreparedText | None = None
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
            _seed_all(cfg.seed + self.dist.rank)  # but each rank its own dropout masks
        self.optimizer = make_optimizer(self.model, cfg.optimizer, cfg.weight_decay, cfg.betas)
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        if note := slow_precision_warning(cfg.precision, self.device):
            self.log(f"warning: {note}")
        # fp16's range needs loss scaling on every device (its small gradients flush to zero), the CPU too
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None
        self.loss_kernels = self._loss_kernels()
        self.step, self.best_bleu, self.bad_evals, self.bad_steps, self.elapsed = 0, -math.inf, 0, 0, 0.0
        self.saved_step: int | None = None  # the step of the newest checkpoint
        self.best_step: int | None = None  # the step best.safetensors was written at by this process
        self._resume()
        self.dist.on_main(self._repair_metrics)
        self.forward, self.loss_fn = self._compiled(self._wrap())
        self.monitor = Monitor(self.run_dir, active=self.dist.is_main, progress=cfg.progress,
                               tensorboard=cfg.tensorboard, log_every=cfg.log_every, log=self.log)
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
                    self.elapsed += time.perf_counter() - t0
                    early_stop = self._after_update(stats, micro)
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

    def _after_update(self, stats: StepStats, micro: list) -> bool:
        """Count the update, then log, evaluate and save at their set points; True when
        evaluation says to stop early."""
        c = self.cfg
        if stats.skipped:  # on every rank alike: train_step all-reduces the verdict
            self._skipped(stats, micro)
            return False
        self.bad_steps = 0
        self.step += 1
        extra = {"dropout": self._dropout(self.step)} if c.dropout_ramp else {}
        self.monitor.update(self.step, self.sampler.state_dict()["epoch"], stats, self.elapsed / 60, **extra)
        early_stop = self.step % c.eval_every == 0 and self.evaluate() == "early_stop"
        if self.step % c.save_every == 0:
            self.save()
        return early_stop

    def _skipped(self, stats: StepStats, micro: list) -> None:
        self.bad_steps += 1
        self.monitor.record({"event": "skipped_step", "step": self.step, "loss": stats.loss}, self.step)
        if self.dist.any([int(not finite_in_fp32(self.model, micro))])[0]:
            self._broken_weights()
        if self.bad_steps >= self.cfg.max_bad_steps:
            saved = self.save()  # skipped updates leave the weights as they were: good
            raise UserError(f"{self.bad_steps} consecutive updates had a non-finite loss or gradient; stopping. "
                            f"The last good checkpoint is {saved}; try a lower learning rate or precision=fp32")

    def _broken_weights(self) -> None:
        """Stop without saving: update ``step`` made weights whose loss or gradient is not
        finite even in fp32 without dropout (an absurd learning rate), which no later update
        repairs. A checkpoint of that step, already written, holds them: it is set aside
        (checkpoints/corrupt-step-*), so that a resume starts from the one before; a
        best.safetensors of that step (a broken model may score a first BLEU of 0) is deleted."""
        newest = layout.latest_checkpoint(self.run_dir)
        if newest is not None and self.saved_step == self.step and self.dist.is_main:
            with contextlib.suppress(OSError):
                layout.set_aside(newest)
            newest = layout.latest_checkpoint(self.run_dir)
        if self.best_step == self.step and self.dist.is_main:
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
        interrupted = reason in ("SIGINT", "SIGTERM")
        final_eval = not interrupted and self.task.has_validation and self.step % c.eval_every != 0
        if final_eval:
            self.evaluate()
        if final_eval or self.saved_step != self.step:
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
            stop.update(self._average(finished))
        self.monitor.record(stop, self.step)
        self.monitor.finish()
        self.log(f"stopped at step {self.step} ({reason}); {self.elapsed / 60:.1f} training minutes; "
                 f"{self.task.best_summary(self.best_bleu)}")
        return result

    def _average(self, finished: bool) -> dict:
        """Average the last ``average_last`` checkpoints into averaged.safetensors, which a run
        directory is read from first. A finished schedule keeps its average as it is (the
        recipe). The average of an unfinished one (a run the clock cut short) is scored on the
        validation set as the best checkpoint was, and kept only when it scores at least as
        well: else it is deleted and the run is read from best.safetensors. What was decided
        goes into the stop record."""
        c, out = self.cfg, self.run_dir / layout.AVERAGED
        dirs = layout.checkpoint_dirs(self.run_dir)[-c.average_last:]
        weights.average_checkpoints(dirs, out)
        if finished:
            self.log(f"averaged {len(dirs)} checkpoint{'s' * (len(dirs) != 1)} -> {out}")
            return {}
        what = f"the average of the last {len(dirs)} checkpoints of the unfinished schedule"
        score = self._score_weights(out) if math.isfinite(self.best_bleu) else None
        if score is None:  # no validation score to hold it against
            self.log(f"averaged {len(dirs)} checkpoint{'s' * (len(dirs) != 1)} of the unfinished schedule -> {out} "
                     "(not checked against the best checkpoint: no validation score)")
            return {}
        name, kept = self.task.score_name, score >= self.best_bleu
        if not kept:
            out.unlink(missing_ok=True)
        loads = layout.resolve_weights(self.run_dir)
        scores = (f"{self.task.score_text(score)}, {'at least' if kept else 'below'} the best checkpoint's "
                  f"{self.task.score_text(self.best_bleu)}")
        self.log(f"{what} scores {scores}: kept in {out}; the run loads it" if kept else
                 f"{what} scores {scores}: not kept; the run loads {loads}")
        return {f"averaged_{name}": score, f"best_{name}": self.best_bleu, "averaged_kept": kept,
                "loads": loads.name}

    def _score_weights(self, path: Path) -> float | None:
        """The validation score of the weights in ``path``, as :meth:`evaluate` scores the
        model (same task, device and precision). The trained model and every RNG are left as
        they were."""
        with torch.random.fork_rng(devices=[]):  # building a model draws its initial weights (on the CPU)
            model, _ = weights.load_model(path, self.device)
        rec = self.task.validate(model, self.device, self.amp_dtype)
        return rec.get(self.task.score_name)

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

    # ---- validation -------------------------------------------------------------------
    def evaluate(self) -> str | None:
        """Validation on rank 0 with the unwrapped model (the other ranks wait); a better
        score saves best.safetensors; "early_stop" when patience has run out."""
        if not self.task.has_validation or not self.dist.is_main:
            return None
        t0 = time.perf_counter()
        rec = {"event": "eval", "step": self.step, **self.task.validate(self.model, self.device, self.amp_dtype)}
        score = rec.get(self.task.score_name)
        if score is not None and score > self.best_bleu:
            self.best_bleu, self.bad_evals, rec["best"] = score, 0, True
            self.best_step = self.step
            weights.save_weights(self.model, self.run_dir / layout.BEST,
                                 {"step": str(self.step), self.task.score_name: f"{score:.2f}"})
        elif score is not None:
            self.bad_evals += 1
        rec["eval_seconds"] = time.perf_counter() - t0
        self.monitor.record(rec, self.step)
        self.log(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
        return "early_stop" if self.cfg.patience and self.bad_evals >= self.cfg.patience else None

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

    # ---- checkpoints ------------------------------------------------------------------
    def save(self) -> Path:
        """Write a checkpoint (rank 0; every rank must call this: it gathers their RNG states).
        A failure (full disk, unwritable folder) is a UserError on every rank; the previous
        checkpoint is intact."""
        rngs = self.dist.gather(ckpt.rng_state(self.device))

        def write() -> Path:
            state = {
                "step": self.step, "optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
                "best_bleu": self.best_bleu, "bad_evals": self.bad_evals, "elapsed": self.elapsed,
                "rng": rngs[0], "rng_per_rank": rngs, "world_size": self.dist.world_size,
                "accum_steps": self.cfg.accum_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            }
            vocab = tokenizer_file(self.cfg, self.run_dir)
            try:
                return ckpt.save_checkpoint(self.run_dir, self.model, state, self.step, self.cfg.keep_last,
                                            {f"{vocab.stem}_sha256": files.file_sha256(vocab),
                                             DATA_SHA256: self.data_sha256})
            except OSError as e:
                raise UserError(f"{self.run_dir}: could not save a checkpoint ({e.strerror or e}); "
                                "the previous checkpoint is intact") from None

        path = self.dist.on_main(write)
        self.saved_step = self.step
        return path

    def _resume(self) -> None:
        """Continue from the newest checkpoint that reads. One that does not (truncated or
        corrupt, e.g. damaged after it was written) is moved aside to checkpoints/corrupt-*
        with a warning and the one before it is used; with no older one, a clear error.
        A checkpoint of another config or vocabulary, or one that would run code, is refused."""
        dirs = layout.checkpoint_dirs(self.run_dir)
        for i, path in enumerate(reversed(dirs)):
            try:
                cfg, tensors, meta = weights.read_weights(path / layout.WEIGHTS)
                state = ckpt.load_training_state(path)
            except ckpt.UnsafeCheckpoint:
                raise
            except UserError as e:
                if i == len(dirs) - 1:
                    raise
                self.log(f"warning: {e}; resuming from the checkpoint before it")
                if self.dist.is_main:
                    with contextlib.suppress(OSError):  # left in place: the next save of that step replaces it
                        layout.set_aside(path)
                continue
            self._restore(path, cfg, tensors, meta, state)
            return

    def _restore(self, path: Path, cfg, tensors: dict, meta: dict, state: dict) -> None:
        if cfg != self.model.cfg:
            raise UserError(f"{path}: checkpoint was written for another model config or vocabulary")
        vocab = tokenizer_file(self.cfg, self.run_dir)
        sha = files.file_sha256(vocab)
        if meta.get(f"{vocab.stem}_sha256", sha) != sha:
            raise UserError(f"{path}: checkpoint was trained with another {vocab.name}")
        weights.load_weights_into(self.model, tensors, path)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self._restore_position(state)
            self.step, self.best_bleu = state["step"], state["best_bleu"]
            self.bad_evals, self.elapsed = state["bad_evals"], state["elapsed"]
            self._restore_rng(state)
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise UserError(f"{path / layout.STATE}: training state does not fit this run "
                            f"({type(e).__name__}: {e})") from None
        self.saved_step = self.step
        self.log(f"resumed from {path} (step {self.step})")

    def _restore_position(self, state: dict) -> None:
        """The data position, mapped onto this run's number of ranks (see reshard_position)."""
        old_world, world = int(state.get("world_size", 1)), self.dist.world_size
        position = state["sampler"]
        if old_world != world:
            position, skipped = reshard_position(position, old_world, world)
            note = f" ({skipped} batch(es) skipped)" if skipped else ""
            self.log(f"resuming on {world} rank(s) a run saved on {old_world}: epoch {position['epoch']} "
                     f"continues at batch {position['batch_in_epoch'] * world}{note}")
        old_batch = old_world * int(state.get("accum_steps", self.cfg.accum_steps))
        if old_batch != world * self.cfg.accum_steps:
            self.log(f"warning: the global batch changes from {old_batch} to {world * self.cfg.accum_steps} "
                     "micro-batches per update (ranks x accum_steps); keep the product to keep the trajectory")
        self.sampler.load_state_dict(position)

    def _restore_rng(self, state: dict) -> None:
        per_rank = state.get("rng_per_rank") or [state["rng"]]
        if self.dist.rank < len(per_rank):
            ckpt.set_rng_state(per_rank[self.dist.rank], self.device)
        else:  # a rank the saved run did not have
            _seed_all(self.cfg.seed + self.dist.rank)

    def _repair_metrics(self) -> None:
        dropped, torn = ckpt.repair_metrics(self.run_dir / layout.METRICS, self.step)
        if dropped or torn:
            self.log(f"metrics.jsonl: removed {dropped} record(s) of steps after {self.step}, which this run "
                     "repeats" + (", and a torn last line left by a crash" if torn else ""))

    # ---- set-up -----------------------------------------------------------------------
    def _max_len(self) -> int:
        return self.start.model_config(vocab_size=max(self.cfg.vocab_size, 8)).max_len

    def _prepare_run_dir(self) -> None:
        self.data = prepare_run(self.cfg, self.run_dir, self._max_len(), self.log, self.start.subwords,
                                self.start.tokenizer_files)
        self.data_sha256 = json.dumps(data_checksums(self.cfg))  # each checkpoint records it

    def _loss_kernels(self):
        if not (self.cfg.compile_loss and self.device.type == "cpu"):
            return None
        kernels = compile_loss(dtype=self.amp_dtype or torch.float32)
        if kernels is not None:
            self.log("loss: compiled kernels (compile_loss: true)")
        return kernels

    def _compiled(self, wrapper):
        """The forward train_step runs (the DDP wrapper, else None: the model) and its loss
        function. ``compile: true``: one process compiles the forward pass and the loss as
        one graph with torch.compile, at the window's fixed shape (its backward is one graph
        too); under DDP the wrapper's forward is compiled and the loss stays eager, outside
        the wrapper as DDP requires. Validation and decoding stay eager."""
        if not self.cfg.compile:
            return wrapper, forward_loss
        from .. import compiling  # noqa: F401  (the model's forms for a traced graph, before torch.compile traces)

        self.log("model: the training forward, loss and backward compiled by torch.compile (compile: true)")
        # CPU: the graphs' calls in C++ rather than Python (1.08x an update, nanoGPT's recipe in bf16)
        options = {"cpp_wrapper": True} if self.device.type == "cpu" else None
        if wrapper is not None:
            return torch.compile(wrapper, dynamic=False, options=options), forward_loss
        return None, torch.compile(forward_loss, dynamic=False, options=options)

    def _wrap(self):
        """The DistributedDataParallel wrapper train_step runs forward through (None: one process)."""
        if not self.dist.enabled:
            return None
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # The only buffer is the constant positional-encoding table: nothing to sync each step.
        return DistributedDataParallel(self.model, device_ids=ids, forward_sync_buffers=False)


@contextlib.contextmanager
def undone_if_it_fails(run_dir: Path, active: bool):
    """A new run whose set-up fails (bad input: a file, an option, a vocabulary) leaves the
    run directory as it found it: what the attempt wrote there is removed, and the directory
    itself when the attempt made it. A run that holds a checkpoint is never touched."""
    existed = run_dir.exists()
    before = set(run_dir.iterdir()) if run_dir.is_dir() else set()
    holds_run = layout.latest_checkpoint(run_dir) is not None
    try:
        yield
    except BaseException:
        if active and not holds_run and run_dir.is_dir():
            for path in set(run_dir.iterdir()) - before:
                layout.remove(path)
            if not existed:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()
        raise


def refuse_inside_checkpoints(run_dir: Path) -> None:
    """A UserError when ``run_dir`` lies in another run's checkpoints/ (before anything is
    made there): that run's checkpoints would read this run's config and vocabulary (run
    files are looked up two folders up), and its keep_last deletes the folders in it."""
    for folder in (run_dir.resolve(), *run_dir.resolve().parents):
        if folder.name == layout.CKPT_DIR and (folder.parent / layout.CONFIG).is_file():
            raise UserError(f"--out {run_dir}: inside the checkpoints of the run {folder.parent}, whose checkpoints "
                            "would read this run's config and vocabulary (and whose keep_last deletes folders "
                            "there); use another --out")


def check_run_dir(run_dir: Path, cfg: TrainConfig) -> None:
    """Refuse to resume a run under a different config: only the fields declared
    ``resumable`` in TrainConfig may change. Only a directory holding a checkpoint holds a
    run: a failed first attempt leaves nothing that binds."""
    make_run_dir(run_dir)
    path = run_dir / layout.CONFIG
    if not (path.is_file() and layout.latest_checkpoint(run_dir) is not None):
        return
    saved = layout.read_yaml(path, "restore it or use another --out") or {}
    if not isinstance(saved, dict) or not isinstance(saved.get("model") or {}, dict):
        what = "model is not a mapping" if isinstance(saved, dict) else "not a mapping of option: value"
        raise UserError(f"{path}: not a run config ({what}); restore it or use another --out")
    new, free = cfg.to_dict(), TrainConfig.resumable_fields()
    saved = {**TrainConfig().to_dict(), **_before_it_existed(saved), **saved}  # an option newer than the run
    recorded = _recorded_data(run_dir)
    if recorded is not None:  # the data files are checked by their content, wherever they are named from
        free = free | set(DATA_FILES)
    changed = sorted(k for k, v in new.items() if k not in free and k != "model" and saved.get(k) != v)
    old_model, new_model = saved.get("model") or {}, new["model"]
    changed += sorted(f"model.{k}" for k in set(old_model) | set(new_model) if old_model.get(k) != new_model.get(k))
    if changed:
        raise UserError(f"{run_dir}: holds a run with a different config ({', '.join(changed)}); "
                        "use another --out, or the same config to resume")
    if recorded is not None:
        _check_data(run_dir, cfg, recorded)


def _recorded_data(run_dir: Path) -> dict | None:
    """The data checksums the newest checkpoint recorded; None for a checkpoint older than
    the record, or one that does not read (the resume sets it aside or names it)."""
    newest = layout.latest_checkpoint(run_dir)
    try:
        recorded = json.loads(weights.read_metadata(newest / layout.WEIGHTS)[DATA_SHA256])
    except (UserError, KeyError, ValueError, TypeError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _check_data(run_dir: Path, cfg: TrainConfig, recorded: dict) -> None:
    """A resumed run reads the files it trained on: moved or named from another folder they
    may be, but a file not found, or not the one trained on (edited, another), is refused."""
    now = data_checksums(cfg)
    for key, sha in now.items():
        names, shas = (getattr(cfg, key), sha) if key == "text_files" else ([getattr(cfg, key)], [sha])
        missing = [n for n, h in zip(names, shas) if h is None]
        if missing:
            raise UserError(f"{key} {missing[0]}: file not found from {Path.cwd()}; a config's paths are relative to "
                            f"the folder training starts in: resume there, or name the file from here "
                            f"(--set {key}=...)")
    changed = [k for k in DATA_FILES if now.get(k) != recorded.get(k)]
    if changed:
        what = ", ".join(f"{k} {_named(getattr(cfg, k))}" for k in changed)
        raise UserError(f"{run_dir}: {what}: not the data the run trained on (other content than its checkpoints "
                        f"recorded); resume with the files as they were, or train on these in a new run: "
                        f"--out NEW --set init_from={run_dir}")


def _named(value: str | list[str] | None) -> str:
    """A data key's value as a message names it: the path, [a, b] for text_files, (none)."""
    if isinstance(value, list):
        return f"[{', '.join(value)}]"
    return value or "(none)"


def _before_it_existed(saved: dict) -> dict:
    """What a run made before an option existed did, where that differs from the option's
    default: a dataset-files run without validation files held nothing out (valid_size 0)."""
    if saved.get("dataset") == "files" and not saved.get("valid_src"):
        return {"valid_size": 0.0}
    return {}
