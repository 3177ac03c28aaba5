"""The run directory, below both training and inference: its layout (:mod:`.layout`),
model weights on disk (:mod:`.weights`) and the one atomic-write helper every writer uses
(:mod:`.files`). Inference code imports this package, never ``transformer.train``."""
from .files import atomic_dir, atomic_write, file_sha256, write_text_atomic
from .layout import (AVERAGED, BEST, CKPT_DIR, COMPILED, CONFIG, METRICS, STATE, SUBWORDS, WEIGHTS, checkpoint_dirs,
                     find_subwords, latest_checkpoint, read_run_config, resolve_weights, run_file,
                     run_root)
from .weights import (average_checkpoints, load_model, load_weights_into, read_model_config, read_weights, save_weights,
                      unique_state_dict)

__all__ = ["atomic_write", "atomic_dir", "write_text_atomic", "file_sha256",
           "CONFIG", "SUBWORDS", "METRICS", "CKPT_DIR", "WEIGHTS", "STATE", "BEST", "AVERAGED", "COMPILED",
           "run_file", "run_root", "find_subwords", "read_run_config", "resolve_weights", "checkpoint_dirs", "latest_checkpoint",
           "load_model", "read_model_config", "read_weights", "save_weights", "load_weights_into", "unique_state_dict",
           "average_checkpoints"]
