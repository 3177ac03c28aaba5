"""Write docs/config.md, the reference of every config key, from the config classes.

    python tools/gen_config_doc.py           # (re)write docs/config.md
    python tools/gen_config_doc.py --check   # exit 1 when docs/config.md is not what it would write

A key's meaning is the comment at the end of its line in its class (else its entry under
``Args:`` in the class docstring); ``# ---- name ----`` comments in a class body group the
keys that follow. A key without a meaning is an error that names its file and line.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # document this checkout's classes, not an installed copy
    sys.path.insert(0, str(ROOT / "src"))

from transformer.errors import UserError  # noqa: E402

COMMAND = "python tools/gen_config_doc.py"
DOC = ROOT / "docs" / "config.md"
PARAMS_VOCAB = 8000  # the vocabulary size the presets' parameter counts are given for
SECTION = re.compile(r"-{2,}\s*(.*?)\s*-{2,}$")  # a comment "# ---- name ----", less its "#"
REQUIRED = object()  # the default of a field that has none


@dataclass(frozen=True)
class Key:
    """One config key as the reference shows it."""

    name: str
    type: str  # the annotation, as written in the class
    default: Any  # REQUIRED when the field has none
    meaning: str
    group: str  # the ``# ---- group ----`` above it ("" before any)
    resumable: bool


# ---- reading the classes ----

def comments(source: str) -> tuple[dict[int, str], dict[int, str]]:
    """(trailing, alone): the text of each comment by line number, split into comments that
    end a line of code and comments that stand on their own line."""
    trailing, alone = {}, {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            (alone if not tok.line[: tok.start[1]].strip() else trailing)[tok.start[0]] = text
    return trailing, alone


def docstring_args(cls: type) -> dict[str, str]:
    """``name: text`` entries under ``Args:`` in the class docstring (continuation lines joined)."""
    found: dict[str, str] = {}
    name, inside = None, False
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        if line.strip() == "Args:":
            inside = True
        elif inside and re.match(r"\s{4}\w+:", line) and not line.startswith(" " * 5):
            name, _, text = line.strip().partition(":")
            found[name] = text.strip()
        elif inside and name and line.startswith(" " * 5):
            found[name] += " " + line.strip()
        elif inside and line.strip():
            inside, name = False, None
    return {name: text.removesuffix(".") for name, text in found.items()}  # as a comment reads


def _shown(path: str | Path) -> str:
    """``path`` relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _class_node(tree: ast.Module, name: str, path: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise UserError(f"{path}: no top-level class {name}")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def class_keys(cls: type) -> list[Key]:
    """Every field of the dataclass ``cls`` with its meaning and group, in the class's order
    (a field a base dataclass declares is read from that base's body). Raises UserError
    naming ``file:line`` for a field without a meaning."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    keys: dict[str, Key] = {}
    for owner in reversed(cls.__mro__):
        if dataclasses.is_dataclass(owner):
            keys.update({k.name: k for k in _body_keys(owner, fields)})
    missing = sorted(set(fields) - set(keys))
    if missing:
        raise UserError(f"{_shown(inspect.getsourcefile(cls))}: {cls.__name__} fields {missing} are declared in "
                        "no class body this reader can find")
    return [keys[name] for name in fields]


def _body_keys(cls: type, fields: dict[str, dataclasses.Field]) -> list[Key]:
    """The fields declared in the body of ``cls`` itself."""
    path = inspect.getsourcefile(cls)
    source = Path(path).read_text(encoding="utf-8")
    trailing, alone = comments(source)
    node = _class_node(ast.parse(source), cls.__name__, path)
    sections = {line: m.group(1) for line, text in alone.items()
                if node.lineno < line <= node.end_lineno and (m := SECTION.fullmatch(text))}
    from_doc = docstring_args(cls)
    keys = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and stmt.target.id in fields):
            continue
        f = fields[stmt.target.id]
        meaning = trailing.get(stmt.end_lineno) or from_doc.get(f.name, "")
        if not meaning:
            raise UserError(f"{_shown(path)}:{stmt.lineno}: {cls.__name__}.{f.name} has no meaning: end its line "
                            "with a comment that says what it does")
        group = max(((line, title) for line, title in sections.items() if line < stmt.lineno), default=(0, ""))[1]
        keys.append(Key(f.name, str(f.type), _default(f), meaning, group, bool(f.metadata.get("resumable"))))
    return keys


# ---- formatting ----

def yaml_value(value: Any) -> str:
    """``value`` as a YAML config writes it: null, true, 1.0e-5, [0.9, 0.98], {preset: tiny}."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float):
        mantissa, e, exp = repr(value).partition("e")
        # YAML 1.1 reads 1e-05 as a string; 1.0e-5 is a float
        return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exp):+d}" if e else mantissa
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(yaml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        import yaml

        return value if value and yaml.safe_load(value) == value else json.dumps(value)
    return str(value)


def cell(text: str) -> str:
    """Plain text made safe in a Markdown table cell (pipes and emphasis markers escaped)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def code(text: str) -> str:
    """``text`` as inline code in a Markdown table cell."""
    return "`" + text.replace("|", "\\|") + "`"


def default_cell(key: Key) -> str:
    return "(required)" if key.default is REQUIRED else code(yaml_value(key.default))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


# ---- what the command line offers ----

def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each ``transformer`` command's parser, by name."""
    from transformer.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def decoding_flags(parsers: dict[str, argparse.ArgumentParser]) -> dict[str, tuple[str, list[str]]]:
    """DecodingConfig field -> (its flag, the commands that take it). A decoding flag is one
    whose help names the run's ``decoding.<field>`` as its default (cli/_options.py)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for command, parser in parsers.items():
        for action in parser._actions:
            if action.option_strings and f"the run's decoding.{action.dest}," in (action.help or ""):
                flag, commands = found.setdefault(action.dest, (action.option_strings[0], []))
                commands.append(command)
    return found


def option_for(parser: argparse.ArgumentParser, name: str) -> str | None:
    """The option that sets the setting ``name``: ``--name`` itself, or ``--no-name``."""
    for action in parser._actions:
        if action.option_strings and action.dest in (name, f"no_{name}"):
            return action.option_strings[0]
    return None


# ---- the page ----

def intro(decoding_commands: list[str]) -> list[str]:
    commands = ", ".join(f"`{c}`" for c in decoding_commands)
    return [
        "# Configuration reference",
        "",
        f"Generated by `{COMMAND}` from the config classes; do not edit. A key's meaning is the",
        "comment at the end of its line in its class: change it there and rerun the command.",
        "",
        "## How configs are given",
        "",
        "- **Training** reads a YAML file of the [training keys](#training-keys): "
        "`transformer train --config configs/multi30k-en-de.yaml`. A key left out takes its default; "
        "an unknown key is an error.",
        "- **`--set key=value`** (repeatable) overrides one key after the file is read; the value is read "
        "as YAML (`--set max_steps=200`, `--set eval_bleu=false`). `model.X` and `decoding.X` set one key "
        "of those sections: `--set model.dropout=0.1 --set decoding.beam=5`.",
        "- **Resuming**: training into a run directory that holds a checkpoint resumes it. Only the keys "
        "marked *may change* may differ from the run's config.yaml; any other change is refused. The data "
        "files (`train_src`, `train_tgt`, `valid_src`, `valid_tgt`, `text_files`) are checked by content: "
        "paths are relative to the folder training starts in, so a run resumed from another folder names "
        "them from there (`--set train_src=...`); a file edited or replaced since the checkpoints is refused "
        "(train on it in a new run with `init_from`).",
        f"- **Decoding** ({commands}): each setting is the command's flag when given, else the run's "
        "`decoding:` section (in its config.yaml), else the [default](#decoding-keys).",
        "- **The service** (`transformer serve`) takes its [settings](#service-keys) as flags.",
        "",
    ]


def training_section(keys: list[Key]) -> list[str]:
    lines = ["## Training keys", "",
             "`TrainConfig` (src/transformer/train/train_config.py): the top level of a training config.", ""]
    for group in dict.fromkeys(k.group for k in keys):
        rows = [[code(k.name), code(k.type), default_cell(k), "may change" if k.resumable else "",
                 cell(k.meaning)] for k in keys if k.group == group]
        title = group or "other"
        lines += [f"### {cell(title[:1].upper() + title[1:])}", "",
                  *table(["key", "type", "default", "on resume", "meaning"], rows), ""]
    return lines


def model_section(keys: list[Key], default_model: dict[str, Any]) -> list[str]:
    from transformer.model.config import PRESETS

    names = ", ".join(f"`{n}`" for n in PRESETS)
    rows = [[code(k.name), code(k.type), default_cell(k), cell(k.meaning)] for k in keys]
    return ["## Model keys", "",
            "The `model:` section of a training config: `preset` (one of the [presets](#model-presets): "
            f"{names}; default `{default_model.get('preset')}`) and any key below, which replaces the preset's "
            "value: `model: {preset: small, dropout: 0.2}`. The defaults are those of `ModelConfig` "
            "(src/transformer/model/config.py) in Python; a preset replaces some of them. Training sets `vocab_size` "
            "from its tokenizer.", "",
            *table(["key", "type", "default", "meaning"], rows), ""]


def preset_descriptions() -> dict[str, str]:
    """The one-line description of each preset in the docstring of transformer.model.config."""
    import transformer.model.config as module

    found = {}
    for line in (module.__doc__ or "").splitlines():
        name, _, text = line.strip().partition(" ")
        if name in module.PRESETS and text.strip():
            found[name] = text.strip()
    return found


def parameter_count(name: str) -> int:
    """Parameters of the preset's model for a shared vocabulary of PARAMS_VOCAB tokens, counted
    on the meta device (no memory, no time)."""
    import torch

    from transformer.model.config import ModelConfig
    from transformer.model import build_model

    with torch.device("meta"):
        model = build_model(ModelConfig.preset(name, vocab_size=PARAMS_VOCAB))
    return sum(p.numel() for p in model.parameters())


def presets_section() -> list[str]:
    from transformer.model.config import PRESETS, ModelConfig

    shown = ("kind", "d_model", "n_heads", "n_layers", "d_ff")
    defaults, about, rows = ModelConfig(vocab_size=PARAMS_VOCAB), preset_descriptions(), []
    for name, preset in PRESETS.items():
        other = ", ".join(f"{k}: {yaml_value(v)}" for k, v in preset.items() if k not in shown)
        rows.append([code(name), cell(about.get(name, "")), *(str(preset.get(k, getattr(defaults, k))) for k in shown),
                     f"{parameter_count(name) / 1e6:.1f}M", cell(other)])
    return ["### Model presets", "",
            f"Parameters are counted for a shared vocabulary of {PARAMS_VOCAB:,} tokens. A preset's other "
            "settings replace the defaults above.", "",
            *table(["preset", "what", *shown, "parameters", "other settings"], rows), ""]


def decoding_section(keys: list[Key], flags: dict[str, tuple[str, list[str]]]) -> list[str]:
    rows = []
    for k in keys:
        flag, commands = flags.get(k.name, (None, []))
        rows.append([code(k.name), f"`{flag}` ({', '.join(commands)})" if flag else "", code(k.type),
                     default_cell(k), cell(k.meaning)])
    return ["## Decoding keys", "",
            "`DecodingConfig` (src/transformer/decode/decoding_config.py): the `decoding:` section of a training config, "
            "which the run keeps for the commands that decode with it, and those commands' flags. A key without "
            "a flag is set in the `decoding:` section only.", "",
            *table(["key", "flag (commands)", "type", "default", "meaning"], rows), ""]


def service_section(keys: list[Key], serve: argparse.ArgumentParser) -> list[str]:
    rows = [[code(k.name), code(option_for(serve, k.name)) if option_for(serve, k.name) else "",
             code(k.type), default_cell(k), cell(k.meaning)] for k in keys]
    return ["## Service keys", "",
            "`ServeConfig` (src/transformer/serve/serve_config.py): how `transformer serve` batches and what it accepts; "
            "it decodes with the [decoding keys](#decoding-keys). A key without a flag is set in Python: "
            "`transformer.serve.create_app(translator, ServeConfig(...))`.", "",
            *table(["key", "flag", "type", "default", "meaning"], rows), ""]


def render() -> str:
    """The whole of docs/config.md."""
    from transformer.model.config import ModelConfig
    from transformer.decode.decoding_config import DecodingConfig
    from transformer.serve.serve_config import ServeConfig
    from transformer.train.train_config import TrainConfig

    parsers = command_parsers()
    flags = decoding_flags(parsers)
    decoding_commands = sorted({c for _, commands in flags.values() for c in commands}, key=list(parsers).index)
    lines = [*intro(decoding_commands), *training_section(class_keys(TrainConfig)),
             *model_section(class_keys(ModelConfig), TrainConfig().model), *presets_section(),
             *decoding_section(class_keys(DecodingConfig), flags), *service_section(class_keys(ServeConfig),
                                                                                    parsers["serve"])]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gen_config_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the page is up to date (exit 1 if not)")
    parser.add_argument("--out", type=Path, default=DOC, help="the page to write (default: docs/config.md)")
    args = parser.parse_args(argv)
    try:
        text = render()
        if args.check:
            current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
            if current != text:
                print(f"{_shown(args.out)}: out of date; regenerate it with `{COMMAND}`", file=sys.stderr)
                return 1
            return 0
        from transformer.run.files import write_text_atomic

        write_text_atomic(args.out, text)
    except UserError as e:
        print(f"gen_config_doc: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {_shown(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
