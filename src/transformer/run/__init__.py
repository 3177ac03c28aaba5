"""The run directory, below both training and inference: its layout (:mod:`.layout`),
model weights on disk (:mod:`.weights`), the one atomic-write helper every writer uses
(:mod:`.files`) and the lock of the one process that writes a run (:mod:`.lock`).
Inference code imports this package, never ``transformer.train``.

Two floors: :mod:`.files`, :mod:`.layout` and :mod:`.lock` import nothing but the standard
library (and :mod:`transformer.errors`), so the data layer may use them; :mod:`.weights`
builds models.
The names below are imported on first use (PEP 562), so ``from ..run.files import
atomic_write`` loads no model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# public name -> the module that defines it
_LAZY = {
    **dict.fromkeys(("atomic_write", "atomic_dir", "write_text_atomic", "file_sha256"), ".files"),
    **dict.fromkeys(("CONFIG", "SUBWORDS", "METRICS", "CKPT_DIR", "WEIGHTS", "STATE", "BEST", "AVERAGED", "COMPILED",
                     "DECODING_FILES", "run_file", "run_root", "find_subwords", "read_run_config", "resolve_weights",
                     "checkpoint_dirs", "latest_checkpoint"), ".layout"),
    **dict.fromkeys(("lock_run", "RunLock"), ".lock"),
    **dict.fromkeys(("load_model", "read_model_config", "read_weights", "save_weights", "load_weights_into",
                     "unique_state_dict", "average_checkpoints"), ".weights"),
}
__all__ = list(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from .files import atomic_dir, atomic_write, file_sha256, write_text_atomic
    from .layout import (AVERAGED, BEST, CKPT_DIR, COMPILED, CONFIG, DECODING_FILES, METRICS, STATE, SUBWORDS,
                         WEIGHTS, checkpoint_dirs, find_subwords, latest_checkpoint, read_run_config, resolve_weights,
                         run_file, run_root)
    from .lock import RunLock, lock_run
    from .weights import (average_checkpoints, load_model, load_weights_into, read_model_config, read_weights,
                          save_weights, unique_state_dict)


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
