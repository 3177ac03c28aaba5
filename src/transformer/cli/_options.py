"""Options shared by several commands (a leading underscore: not a command module).

The decoding options are declared once, from :class:`~transformer.decode.decoding_config.DecodingConfig`:
each defaults to the run's own setting (the ``decoding`` section of its config.yaml), else
to the config's default, and is checked once, when the config is built."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from ..decode.decoding_config import FIELDS, PRECISIONS, SamplingConfig, SearchConfig

_HELP = {
    "beam": ("N", int, "beam size (1 = greedy search)"),
    "alpha": ("A", float, "length penalty exponent"),
    "length_norm": ("N", str, "how the length penalty grows: gnmt, ((5 + len) / 6) ** alpha; length, len ** alpha "
                              "(as Hugging Face and fairseq)"),
    "n_best": ("N", int, "print the N best translations (tab-separated with scores)"),
    "max_tokens": ("N", int, "source tokens per batch (none given: 4000, or 20000 for a translation on a GPU)"),
    "precision": ("P", str, f"decoding arithmetic, one of {', '.join(PRECISIONS)}: auto is fp32 or bf16, "
                            "whichever a short measurement on this CPU found faster (kept in your cache; "
                            "on a GPU bf16 where it is native); fastest is auto with int8 allowed (fp32, bf16 "
                            "or int8, whichever measured fastest); bf16 weights, or int8 weights (CPU; each "
                            "layer by the int8 kernel measured fastest: an int8 GEMM or weight-only; "
                            "transformer info shows the choice); the speed and BLEU cost: "
                            "benchmarks/decode/README.md"),
    "device": ("DEVICE", str, "auto (a CUDA GPU when there is one), cpu or cuda[:N]"),
    "shortlist": (None, bool, "project onto a vocabulary shortlist only: the target tokens that co-occur with the "
                              "batch's source tokens in the run's training corpus, and the 100 most frequent "
                              "(faster at a large vocabulary; the run's shortlist.safetensors, built from its "
                              "corpus on first use; --no-shortlist: the whole vocabulary)"),
    "max_new_tokens": ("N", int, "tokens to generate after the prompt"),
    "temperature": ("T", float, "sampling temperature; 0 = greedy (always the most probable token)"),
    "top_k": ("K", int, "sample only among the K most probable tokens (0 = all)"),
    "top_p": ("P", float, "sample only among the most probable tokens whose probability reaches P (1 = all)"),
    "seed": ("S", int, "random seed: the same seed gives the same text; without one, a fresh one each run"),
    "compile": ("WHEN", str, "on, off or auto: decode through one step compiled ahead of time on a "
                             "fixed-size cache (the same output, faster per token; in bf16 a score may "
                             "differ in its last digits); on builds it if it is missing (a minute or a few, "
                             "once: it is kept in your cache, ~/.cache/transformer/compiled), auto uses it "
                             "when it is there (and builds one for a generation of >= 32768 new tokens), "
                             "off decodes eagerly; "
                             "TRANSFORMER_COMPILE=off in the environment means off everywhere"),
}


# The decoding options only translation's search reads, and those only a language model's
# sampling reads (the rest, batch size, precision, device and compiled step, both may).
SEARCH_OPTIONS = tuple(f.name for f in dataclasses.fields(SearchConfig))
SAMPLING_OPTIONS = tuple(f.name for f in dataclasses.fields(SamplingConfig))


def refuse_options(args: argparse.Namespace, names, purpose: str, instead: str) -> None:
    """The options among ``names`` (argparse dests) that the user gave, though the command, as
    asked (this model kind, this mode), does not use them: one line naming them and what to
    do, never silently ignored, e.g. "--beam is for translation; --text scores a language
    model (remove --beam)". Such options default to None (a flag to False), so only what was
    typed counts; a name the command does not have is skipped."""
    from ..errors import UserError

    flags = [f"--{name.replace('_', '-')}" for name in names
             if (value := getattr(args, name, None)) is not None and value is not False]
    if flags:
        shown = ", ".join(flags)
        raise UserError(f"{shown} {'is' if len(flags) == 1 else 'are'} {purpose}; {instead} (remove {shown})")


def refuse_output_over_inputs(output: str, inputs: dict, models) -> None:
    """A one-line UserError when ``--output`` names what the command reads: one of ``inputs``
    (option -> the file given, or None), or a file a ``models`` run keeps (its config,
    vocabulary, weights, metrics, curve, anything in checkpoints/), which the output would
    replace. A new file inside a run is fine."""
    from pathlib import Path

    from ..errors import UserError
    from ..run.layout import AVERAGED, BEST, CKPT_DIR, CURVE, DECODING_FILES, METRICS, SHORTLIST, run_root

    out = Path(output).resolve()
    for option, given in inputs.items():
        if given and Path(given).resolve() == out:
            raise UserError(f"--output {output} is the {option} file, which the translations would replace; "
                            "give another file")
    for model in models:
        run_dir = run_root(model)
        if run_dir is None:
            continue
        root = run_dir.resolve()
        kept = {root / name for name in (*DECODING_FILES, METRICS, CURVE, BEST, AVERAGED, SHORTLIST)} | {Path(model).resolve()}
        if out in kept or root / CKPT_DIR in out.parents:
            raise UserError(f"--output {output} is a file of the run {run_dir}, which the translations would "
                            "replace; give another file")


def check_count(args: argparse.Namespace, name: str, must: str = "at least 1") -> None:
    """A count option (``--steps``, ``--num-samples``, ...) below 1: one line naming it
    ("--steps must be at least 1, got 0"); not given (None): nothing to check."""
    from ..errors import UserError

    value = getattr(args, name)
    if value is not None and value < 1:
        raise UserError(f"--{name.replace('_', '-')} must be {must}, got {value}")


def new_directory(value: str, option: str = "--out") -> None:
    """A directory a command writes whole (an export, an imported run: written beside it and
    renamed onto it) is not the current directory: an empty one would be removed and replaced
    under the shell that stands in it (an empty ``--out ""``, the same to the filesystem, is
    refused for every command: cli/__init__.py)."""
    from pathlib import Path

    from ..errors import UserError

    if Path(value).resolve() == Path.cwd().resolve():
        raise UserError(f"{option} {value}: the current directory; give the name of a new directory "
                        "(or an empty one other than the current directory)")
    if Path(value).is_symlink():  # the rename that ends the writing would replace the link, not fill its folder
        raise UserError(f"{option} {value}: a symbolic link (to {Path(value).readlink()}); give the directory itself")


def add_decoding_options(p: argparse.ArgumentParser, *names: str) -> None:
    """``--beam``, ``--alpha``, ... for the named DecodingConfig fields. No argparse
    ``choices``: a bad value is reported as one line naming the option, without the usage."""
    for name in names:
        metavar, kind, text = _HELP[name]
        if kind is bool:  # --name / --no-name; unset (None): the run's setting
            p.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction,
                           default=None, help=f"{text} (default: the run's decoding.{name}, else {FIELDS[name]})")
            continue
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, metavar=metavar,
                       help=f"{text} (default: the run's decoding.{name}, else {FIELDS[name]})")


def decoding_options(args: argparse.Namespace) -> dict:
    """The decoding options given on the command line (the rest come from the run). Every
    decoding command calls this before it loads a model, so the device is checked here
    (:func:`check_device`)."""
    check_device(args)
    return {name: getattr(args, name) for name in FIELDS if getattr(args, name, None) is not None}


def check_device(args: argparse.Namespace) -> None:
    """The device a command decodes on (``--device``, else the ``decoding.device`` of the run
    ``--model`` belongs to) is one this machine has: a one-line error naming where the name
    came from, instead of torch's traceback once the model is loading."""
    from ..errors import UserError
    from ..hardware import device_problem

    name = getattr(args, "device", None)
    source, remedy = f"--device {name}", ""
    model = getattr(args, "model", None)
    model = model[0] if isinstance(model, list) and model else model  # an ensemble: the first model's run
    if name is None:
        if not isinstance(model, str):
            return
        from ..run.layout import CONFIG, read_run_config, run_file

        section = read_run_config(model).get("decoding")
        name = section.get("device") if isinstance(section, dict) else None
        if not isinstance(name, str):  # the default (cpu), or a bad value the decoding config reports
            return
        source, remedy = f"{run_file(model, CONFIG)}: decoding.device {name}", " (or give --device cpu)"
    if problem := device_problem(name):
        raise UserError(f"{source}: {problem}{remedy}")


def say_device(decoder) -> None:
    """One line on stderr when it is a terminal: the device a Translator or Generator runs on
    (``auto`` resolved) and the precision it computes in. A pipe or a log file gets nothing,
    as with the progress bar: output that scripts read stays what it was, and an error stays
    the one line on stderr (``evaluate`` and ``serve`` name the device in their reports)."""
    from ..hardware import device_line
    from ._progress import stderr_is_terminal

    if stderr_is_terminal():
        print(f"device: {device_line(decoder.device)}; precision {decoder.decoding.precision}", file=sys.stderr,
              flush=True)


def prepare_compiled(decoder) -> None:
    """The device it runs on (:func:`say_device`), then a Translator's or Generator's
    compiled step loaded, or built (with one line on stderr first: it takes a while), when
    its decoding settings use one; and a line on stderr when the precision asked for is one
    this CPU computes slowly. What goes wrong on the way (a package refused or not built:
    decoding goes on eagerly) is one ``warning:`` line each."""
    import warnings

    from ..compiled import CompiledStepWarning
    from ..hardware import slow_precision_warning  # (here: it loads torch, which --help does not need)

    say_device(decoder)
    if note := slow_precision_warning(decoder.requested_precision, decoder.decoding.device):
        print(f"warning: {note}", file=sys.stderr, flush=True)

    def show(message, category, *args, **kwargs):  # (as they come: one comes before a rebuild's wait)
        if issubclass(category, CompiledStepWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        shown, warnings.showwarning = warnings.showwarning, show
        compiles, build = decoder.compiles()
        if compiles and build:
            print("compiling the decoding step (a minute or a few, once: it is kept in your cache)",
                  file=sys.stderr, flush=True)
        if compiles:
            decoder.prepare()


def add_shortlist_from(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shortlist-from", nargs=2, metavar=("SRC", "TGT"),
                   help="build the run's vocabulary shortlist from this parallel text (two line-aligned files, "
                        ".gz allowed; replacing any the run has) and decode with it: for an imported model, which "
                        "has no training corpus here")


def shortlist_pairs(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """The sentence pairs of ``--shortlist-from`` (read, empty ones dropped), or None; refused
    with ``--no-shortlist`` or a text without a pair."""
    from ..errors import UserError

    given = getattr(args, "shortlist_from", None)
    if given is None:
        return None
    if getattr(args, "shortlist", None) is False:
        raise UserError("--shortlist-from builds a shortlist to decode with; remove --no-shortlist or --shortlist-from")
    from ..data import clean_pairs, read_parallel

    pairs, _ = clean_pairs(read_parallel(*given))
    if not pairs:
        raise UserError(f"--shortlist-from {given[0]} {given[1]}: no sentence pairs; give a parallel text")
    return pairs
