"""The run directory: what lives where, and finding it from any path inside a run.

    RUN_DIR/config.yaml               the training config (its ``decoding`` section: how the recipe decodes)
    RUN_DIR/subwords.model            the sentencepiece model (translation, and a language model with tokenizer bpe)
    RUN_DIR/chars.json                a character language model's alphabet (tokenizer chars)
    RUN_DIR/metrics.jsonl             one JSON object per log / evaluation line
    RUN_DIR/checkpoints/step-0001000/ model.safetensors + state.pt (optimizer, step, RNG, data position)
    RUN_DIR/best.safetensors          the weights with the best validation BLEU
    RUN_DIR/averaged.safetensors      the average of the last K checkpoints (``transformer average``)
    RUN_DIR/learning_curve.png        training and validation loss by update
    RUN_DIR/import.json               an imported model's record: where it came from, its stop ids
    RUN_DIR/compiled/                 never read: earlier versions kept compiled decoding steps here, and a
                                      run from elsewhere may hold one (they live in the user's cache:
                                      ``transformer.compiled.packages``)
    RUN_DIR/.lock                     held by the ``transformer train`` writing the run (its pid inside;
                                      :mod:`.lock`), removed when it ends

A model path given to any command may be the run directory, a weights file in it, or a
checkpoint directory or its weights file (``checkpoints/step-N/model.safetensors``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import UserError, shown

CONFIG = "config.yaml"
SUBWORDS = "subwords.model"
SUBWORDS_VOCAB = "subwords.vocab"  # its pieces and scores as text, beside it
METRICS = "metrics.jsonl"
CURVE = "learning_curve.png"
CKPT_DIR = "checkpoints"
WEIGHTS = "model.safetensors"  # inside a checkpoint directory
STATE = "state.pt"  # inside a checkpoint directory
BEST = "best.safetensors"
AVERAGED = "averaged.safetensors"
COMPILED = "compiled"  # a folder earlier versions kept compiled decoding steps in: never read (see above)
SHORTLIST = "shortlist.safetensors"  # a translation run's vocabulary shortlist (decode/shortlist.py)
IMPORT_RECORD = "import.json"  # written by transformer import (interop/hf_import.py, interop/marian_run.py)
PREFERRED = (AVERAGED, BEST)  # the weights a run directory is read from, in this order
# The files beside the weights that decoding reads (:func:`run_file` finds them): the config and
# every kind of vocabulary, ours, a Hugging Face import's and a Marian import's (the data
# modules name them too; tests/cli/test_cli_evaluate_average.py checks that none is missing).
DECODING_FILES = (CONFIG, SUBWORDS, SUBWORDS_VOCAB, "chars.json", "tokenizer.json", "tokenizer.model",
                  "tokenizer_config.json", "special_tokens_map.json", "source.spm", "target.spm", "vocab.json",
                  "target_vocab.json")

# Temporary names a crash can leave in a run directory (run.files writes them), swept by the
# next ``transformer train`` (which holds the run's lock, run/lock.py, so none is a live writer's).
STALE_PATTERNS = (f".{CONFIG}.*.tmp", f".{BEST}.*.tmp", f".{AVERAGED}.*.tmp", f".{METRICS}.*.tmp",
                  f".{CURVE}.*.tmp", f".{SUBWORDS}.*.tmp", f".{SUBWORDS_VOCAB}.*.tmp", ".chars.json.*.tmp",
                  ".prepare.*")


def run_file(path: str | Path, name: str, *others: str) -> Path | None:
    """The file ``name`` (subwords.model, config.yaml) of the run that ``path`` belongs to: a
    run directory, or a weights file or checkpoint in one, as deep as
    checkpoints/step-N/model.safetensors; None when there is none. With ``others``: the
    first of the names found in the folder nearest to ``path`` (a run's own tokenizer, not
    another kind in a folder above it)."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    for folder in (root, root.parent, root.parent.parent):
        for each in (name, *others):
            if (folder / each).is_file():
                return folder / each
    return None


def run_root(path: str | Path) -> Path | None:
    """The run directory that ``path`` belongs to (the folder of its config.yaml); None when
    there is none."""
    found = run_file(path, CONFIG)
    return None if found is None else found.parent


def read_stop_ids(path: str | Path, vocab_size: int) -> list[int] | None:
    """The ``stop_ids`` of the import.json of the run that ``path`` belongs to: the ids that
    end an imported model's generation (``generate`` and ``export`` read them here). None when
    there is no import.json, or it is unreadable or lists none (the model's EOS ends it then);
    a one-line UserError naming the file when the list holds anything but ids of the
    vocabulary (an id of 10**30 was an overflow deep in sampling)."""
    import json

    root = run_root(path)
    record = None if root is None else root / IMPORT_RECORD
    if record is None or not record.is_file():
        return None
    try:
        stops = json.loads(record.read_text(encoding="utf-8")).get("stop_ids")
    except (OSError, ValueError, AttributeError):  # damaged: generation ends at the model's EOS, as without it
        return None
    if stops is None or stops == []:
        return None
    wrong = [i for i in stops if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size] \
        if isinstance(stops, list) else [stops]
    if not wrong:
        return stops
    bad = wrong[0]
    shown = repr(bad) if len(repr(bad)) <= 40 else repr(bad)[:37] + "..."
    raise UserError(f"{record}: stop_ids must list token ids of the model (whole numbers from 0 to {vocab_size - 1}), "
                    f"got {shown}; correct the list, or remove it to stop at the model's EOS")


def find_subwords(path: str | Path) -> Path:
    """The subwords.model of the run that ``path`` belongs to (see :func:`run_file`)."""
    found = run_file(path, SUBWORDS)
    if found is None:
        raise UserError(f"{path}: no {SUBWORDS} found beside the weights; give the run directory")
    return found


def read_run_config(path: str | Path) -> dict[str, Any]:
    """The config.yaml of the run that ``path`` belongs to, as a mapping; {} when there is none."""
    found = run_file(path, CONFIG)
    if found is None:
        return {}
    data = read_yaml(found, "restore it from the run, or give the options it would have supplied") or {}
    return data if isinstance(data, dict) else {}


def read_yaml(path: Path, remedy: str) -> Any:
    """The YAML document in the file ``path`` (None when it is empty); a one-line UserError
    naming the file, what is wrong and ``remedy`` when it is not readable UTF-8 YAML. Every
    config file (a training config, a run's config.yaml) is read here.

    A key given twice in one mapping is refused with both line numbers: YAML's safe_load
    keeps the last value and says nothing, so the first one would be silently ignored. So is
    a document whose aliases repeat more than :data:`MAX_ALIASED_VALUES` values, or that nests
    deeper than Python's stack (:func:`load_yaml`), and a file over :data:`MAX_CONFIG_BYTES`."""
    import yaml

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, which no config is (a config is "
                            f"a few kilobytes); {remedy}")
        return load_yaml(data.decode("utf-8"))
    except RecursionError:
        raise UserError(f"{path}: not readable YAML (nested too deeply); {remedy}") from None
    except DuplicateKey as e:
        raise UserError(f"{path}: line {e.line}: key {shown(e.key)} appears twice in one mapping (first on line "
                        f"{e.first}), and only the last would count; keep one") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
        if mark is not None and problem:  # where the parser stopped, and why: "line 4, column 2: expected ..."
            detail = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        else:
            detail = (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: not readable YAML ({detail}); {remedy}") from None


class DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


# What a config's aliases may add: every ``*name`` stands for a copy of its anchor's values, so
# nine anchors of nine aliases each are 9**9 values (gigabytes once printed or walked); a
# config's own aliases (a ``<<: *defaults`` merge) repeat a few dozen.
MAX_ALIASED_VALUES = 100_000
MAX_CONFIG_BYTES = 2**20  # (the largest shipped config is 2.5 kB; parsing a megabyte takes seconds)

_LOADER: Any = None


def load_yaml(text: str) -> Any:
    """The YAML document ``text`` as safe_load reads it, but refused (yaml.YAMLError) when a
    key appears twice in one mapping (DuplicateKey), or when its aliases repeat more than
    :data:`MAX_ALIASED_VALUES` values or refer to themselves, before anything is built.
    Every YAML the commands read goes through here."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader


def _aliased_values(root: Any) -> int:
    """How many values the node tree ``root`` holds beyond its own nodes once each alias is
    expanded into a copy (its anchor's subtree counted once per use), counted once per
    distinct node; ConstructorError for an alias inside its own anchor (an endless value)."""
    import yaml

    expanded: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:  # (not recursive: a deep document must not end in a RecursionError here)
        node, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(c)] for c in _children(node))
            continue
        if id(node) in expanded:
            continue
        if id(node) in open_nodes:
            raise yaml.constructor.ConstructorError(None, None, "an alias refers to its own anchor "
                                                    "(an endless value); write the value out", node.start_mark)
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in expanded)
    distinct = len(expanded)
    return expanded[id(root)] - distinct


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _unique_key_loader() -> Any:
    """yaml.SafeLoader that raises DuplicateKey for a key given twice in one mapping (a
    ``<<`` merge may still be overridden, as YAML means it to be), and refuses a document whose
    aliases expand too far (:func:`_aliased_values`) before constructing it."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):
            def construct_document(self, node):
                if _aliased_values(node) > MAX_ALIASED_VALUES:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"its aliases (*name) repeat more than {MAX_ALIASED_VALUES:,} values; "
                        "write the values out instead", node.start_mark)
                return super().construct_document(node)

            def construct_mapping(self, node, deep=False):
                if isinstance(node, yaml.MappingNode):
                    seen: dict[Any, int] = {}
                    for key_node, _ in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":
                            continue
                        key = self.construct_object(key_node, deep=True)
                        line = key_node.start_mark.line + 1
                        try:
                            if key in seen:
                                raise DuplicateKey(key, seen[key], line)
                        except TypeError:  # an unhashable key: safe_load's own error names it
                            continue
                        seen[key] = line
                return super().construct_mapping(node, deep)

        _LOADER = UniqueKeyLoader
    return _LOADER


def resolve_weights(path: str | Path) -> Path:
    """The weights file a model path stands for: the file itself; a checkpoint's weights; in
    a run directory averaged, else best, else the latest checkpoint's."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise UserError(f"{path}: no such model (give a run directory or a .safetensors file)")
    if (path / WEIGHTS).is_file():
        return path / WEIGHTS
    for name in PREFERRED:
        if (path / name).is_file():
            return path / name
    latest = latest_checkpoint(path)
    if latest is None:
        raise UserError(f"{path}: no weights found (no {AVERAGED} or {BEST}, no {CKPT_DIR}/); "
                        f"{not_a_run_remedy(path)}")
    return latest / WEIGHTS


def not_a_run_remedy(folder: Path) -> str:
    """What to do with a folder that holds no run's weights (the end of a one-line error):
    a Hugging Face model folder (its config.json) is imported; anything else is no model."""
    if (folder / "config.json").is_file():
        return f"a Hugging Face model folder becomes a run with: transformer import {folder} --out RUN"
    return "give a run directory (what transformer train --out or transformer import --out wrote)"


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")
            and (p / WEIGHTS).is_file() and (p / STATE).is_file()]
    return sorted(done, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def discard(path: Path) -> None:
    """Delete a checkpoint directory: first renamed out of the ``step-*`` namespace (atomic),
    then removed, so a crash midway never leaves a half-deleted checkpoint that looks whole."""
    trash = path.with_name(f".old-{path.name}")
    try:
        if trash.exists():
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def set_aside(ckpt: Path) -> Path:
    """Move an unreadable checkpoint to ``checkpoints/corrupt-step-*`` (kept for inspection,
    out of the way of resume, translation and keep_last)."""
    target = ckpt.with_name(f"corrupt-{ckpt.name}")
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    os.replace(ckpt, target)
    return target


def remove_stale_files(run_dir: str | Path) -> None:
    """Delete the temporary files and folders a crash left in ``run_dir``."""
    run_dir = Path(run_dir)
    stale = [p for pattern in STALE_PATTERNS for p in run_dir.glob(pattern)]
    root = run_dir / CKPT_DIR
    if root.is_dir():
        stale += [*root.glob(".step-*"), *root.glob(".old-*")]
    for p in stale:
        remove(p)


def remove(path: Path) -> None:
    """Delete a file, or a folder and all it holds (what is already gone is no error; a
    folder's contents that cannot be removed are left)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
