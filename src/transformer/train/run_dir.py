"""The run directory a training run writes: checked before anything is changed in it, and left as
it was found when a new run's set-up fails.

    check_run_dir(run_dir, cfg)     a resumed run keeps its config (only ``resumable`` fields may
                                    change) and reads the data files it trained on
    refuse_inside_checkpoints(dir)  a run is never made inside another run's checkpoints/
    with undone_if_it_fails(dir):   what a failed first attempt wrote is removed again
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..errors import UserError
from ..run import layout, weights
from ..run.lock import make_run_dir
from .train_config import TrainConfig
from .prepare import DATA_FILES, data_checksums

DATA_SHA256 = "data_sha256"  # a checkpoint's record of its data files' checksums, by key (prepare.data_checksums)


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
