"""Bad input everywhere: exit code 2, ONE stderr line ``transformer CMD: error: ...`` naming
the offending file or option, no traceback; and nothing lost: an existing --output file
keeps its content and no partial or temporary file appears."""
from __future__ import annotations

import errno
import os
import re
import subprocess

from pathlib import Path

import pytest
import torch
import yaml
from alias_bombs import alias_bomb, alias_list
from tiny_corpus import TRANSFORMER, process_env

PRECIOUS = "earlier content\n"


@pytest.fixture
def bad(tmp_path, trained) -> dict[str, Path]:
    """A folder of broken inputs, plus an --output file that must survive every failure."""
    d = tmp_path
    (d / "invalid.yaml").write_text("max_steps: [1, 2\n", encoding="utf-8")
    (d / "unknown.yaml").write_text(trained.config.read_text() + "max_stepz: 3\n", encoding="utf-8")
    (d / "list.yaml").write_text("- 1\n- 2\n", encoding="utf-8")
    (d / "twice.yaml").write_text(trained.config.read_text() + "max_steps: 3\n", encoding="utf-8")
    good = yaml.safe_load(trained.config.read_text(encoding="utf-8"))
    (d / "model-list.yaml").write_text(yaml.safe_dump({**good, "model": ["toy"]}), encoding="utf-8")
    (d / "decoding-number.yaml").write_text(yaml.safe_dump({**good, "decoding": 5}), encoding="utf-8")
    (d / "latin1.yaml").write_bytes("# réglages\nmax_steps: 3\n".encode("latin-1"))
    (d / "latin1.txt").write_bytes(b"red dog runs\nsmall bird\nthe caf\xe9 near the park\n")
    (d / "corrupt.safetensors").write_bytes((trained.run / "best.safetensors").read_bytes()[:5000])
    (d / "nosubwords").mkdir()
    (d / "nosubwords" / "best.safetensors").write_bytes((trained.run / "best.safetensors").read_bytes())
    (d / "in.txt").write_text("red dog runs\n", encoding="utf-8")
    (d / "out").mkdir()
    (d / "out" / "out.txt").write_text(PRECIOUS, encoding="utf-8")
    return {p.name: p for p in d.iterdir()}


def _untouched(out_dir: Path) -> None:
    assert sorted(p.name for p in out_dir.iterdir()) == ["out.txt"], "a partial or temporary file was left"
    assert (out_dir / "out.txt").read_text(encoding="utf-8") == PRECIOUS


# ---- train --------------------------------------------------------------------------------

TRAIN_CASES = {
    # id: (config file name or None for the good one, --set overrides, what the message must name)
    "missing-config": ("missing.yaml", [], ["missing.yaml", "not found"]),
    "invalid-yaml": ("invalid.yaml", [], ["invalid.yaml", "YAML"]),
    "unknown-key": ("unknown.yaml", [], ["unknown.yaml", "max_stepz"]),
    "not-a-mapping": ("list.yaml", [], ["list.yaml"]),
    "key-twice": ("twice.yaml", [], ["twice.yaml", "key 'max_steps' appears twice", "first on line"]),
    "model-not-a-mapping": ("model-list.yaml", [], ["model-list.yaml", "model must be a mapping", "['toy']"]),
    "decoding-not-a-mapping": ("decoding-number.yaml", [], ["decoding-number.yaml", "decoding must be a mapping"]),
    "config-not-utf8": ("latin1.yaml", [], ["latin1.yaml"]),
    "set-without-equals": (None, ["max_steps"], ["--set", "max_steps"]),
    "set-unknown-key": (None, ["max_stepz=3"], ["max_stepz"]),
    "set-unknown-model-key": (None, ["model.d_modle=64"], ["model.d_modle"]),
    "negative-max-steps": (None, ["max_steps=-1"], ["max_steps", "-1"]),
    "zero-save-every": (None, ["save_every=0"], ["save_every"]),
    "bad-preset": (None, ["model.preset=huge"], ["model.preset"]),
    "bad-heads": (None, ["model.n_heads=3"], ["n_heads"]),
    "bad-schedule": (None, ["lr_schedule=exponential"], ["lr_schedule"]),
    "cooldown-past-max-steps": (None, ["max_steps=10", "cooldown=11"], ["cooldown", "11"]),
    "dropout-start-1": (None, ["dropout_ramp=100", "dropout_start=1"], ["dropout_start", "[0, 1)"]),
    "dropout-ramp-negative": (None, ["dropout_ramp=-5"], ["dropout_ramp", "-5"]),
    "bad-dataset": (None, ["dataset=wmt99"], ["dataset"]),
    "missing-train-file": (None, ["train_src=/nonexistent/train.src"], ["/nonexistent/train.src"]),
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_bad_input(case, cli, bad, trained, tmp_path, one_line_error):
    config, sets, mentions = TRAIN_CASES[case]
    config = bad.get(config, tmp_path / config) if config else trained.config
    argv = ["train", "--config", config, "--out", tmp_path / "run"]
    for s in sets:
        argv += ["--set", s]
    one_line_error(cli(*argv), "train", *mentions)
    assert not (tmp_path / "run" / "checkpoints").exists()


# Values of the wrong type are not validated by TrainConfig: some end in a traceback deep in
# the training loop, the others in a UserError that does not say which option was wrong.
BAD_VALUES = ["max_steps=abc", "label_smoothing=abc", "peak_lr=abc", "clip_norm=abc", "threads=abc", "seed=-1",
              "decoding.beam=0", "decoding.top_p=0"]


@pytest.mark.parametrize("setting", BAD_VALUES)
def test_train_bad_value_types(setting, cli, trained, tmp_path, one_line_error):
    r = cli("train", "--config", trained.config, "--out", tmp_path / "run", "--set", setting,
            "--set", "max_steps=2" if not setting.startswith("max_steps") else "save_every=1")
    one_line_error(r, "train", setting.split("=")[0])


def test_train_out_is_a_file(cli, trained, tmp_path, one_line_error):
    out = tmp_path / "afile"
    out.write_text("x")
    one_line_error(cli("train", "--config", trained.config, "--out", out), "train", str(out))
    assert out.read_text() == "x"


def test_train_error_in_a_real_process(tmp_path, real_cli):
    """The console script itself: exit 2, one line, nothing else on stderr (no warnings)."""
    done = real_cli("train", "--config", tmp_path / "nope.yaml", "--out", tmp_path / "r")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"transformer train: error: {tmp_path / 'nope.yaml'}: config file not found"]
    assert done.stdout == ""


# ---- translate ------------------------------------------------------------------------------

TRANSLATE_CASES = {
    # id: (extra argv, with {name} replaced by the path of bad[name]; what the message must name)
    "missing-model": (["--model", "{in.txt}.nothere", "--input", "{in.txt}"], ["in.txt.nothere"]),
    "corrupt-weights": (["--model", "{corrupt.safetensors}", "--input", "{in.txt}"], ["corrupt.safetensors"]),
    "no-subwords": (["--model", "{nosubwords}", "--input", "{in.txt}"], ["nosubwords", "subwords.model"]),
    "input-not-utf8": (["--model", "RUN", "--input", "{latin1.txt}"], ["latin1.txt:3:", "UTF-8"]),
    "missing-input": (["--model", "RUN", "--input", "{in.txt}.nothere"], ["in.txt.nothere"]),
    "input-is-dir": (["--model", "RUN", "--input", "{nosubwords}"], ["nosubwords"]),
    "beam-0": (["--model", "RUN", "--beam", "0", "--input", "{in.txt}"], ["--beam"]),
    "beam-negative": (["--model", "RUN", "--beam", "-2", "--input", "{in.txt}"], ["--beam"]),
    "nbest-over-beam": (["--model", "RUN", "--n-best", "5", "--beam", "4", "--input", "{in.txt}"], ["--n-best", "4"]),
    "nbest-0": (["--model", "RUN", "--n-best", "0", "--input", "{in.txt}"], ["--n-best"]),
    "max-tokens-0": (["--model", "RUN", "--max-tokens", "0", "--input", "{in.txt}"], ["--max-tokens"]),
    "precision-unknown": (["--model", "RUN", "--precision", "fp16", "--input", "{in.txt}"], ["--precision"]),
    # (on a machine without CUDA, --device cuda is refused first: test_device_this_machine_lacks)
    "precision-off-cpu": (["--model", "RUN", "--precision", "int8", "--device", "cuda", "--input", "{in.txt}"],
                          ["--precision" if torch.cuda.is_available() else "--device", "cuda"]),
}


def _argv(template: list[str], bad: dict[str, Path], run: Path) -> list[str]:
    out = []
    for a in template:
        if a == "RUN":
            a = str(run)
        for name, path in bad.items():
            a = a.replace("{" + name + "}", str(path))
        out.append(a)
    return out


@pytest.mark.parametrize("case", list(TRANSLATE_CASES))
def test_translate_bad_input(case, cli, bad, trained, one_line_error):
    template, mentions = TRANSLATE_CASES[case]
    out = bad["out"] / "out.txt"
    r = cli("translate", *_argv(template, bad, trained.run), "--output", out)
    one_line_error(r, "translate", *mentions)
    _untouched(bad["out"])


@pytest.mark.parametrize("case", ["input-not-utf8", "missing-input", "beam-0"])
def test_translate_failure_creates_no_output(case, cli, bad, trained, tmp_path, one_line_error):
    out = tmp_path / "new" / "out.txt"
    r = cli("translate", *_argv(TRANSLATE_CASES[case][0], bad, trained.run), "--output", out)
    one_line_error(r, "translate")
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_unwritable_output(command, cli, bad, trained, one_line_error):
    if command == "translate":
        argv = ["translate", "--model", trained.run, "--input", bad["in.txt"]]
    else:
        argv = ["evaluate", "--model", trained.run, "--src", bad["in.txt"], "--ref", bad["in.txt"]]
    one_line_error(cli(*argv, "--output", bad["out"]), command, str(bad["out"]))
    _untouched(bad["out"])


# ---- a device this machine does not have ------------------------------------------------------

DEVICE_COMMANDS = {
    "train": ["train", "--config", "CONFIG", "--out", "{out}/run"],
    "translate": ["translate", "--model", "RUN", "--input", "{in.txt}", "--output", "{out}/out.txt"],
    "evaluate": ["evaluate", "--model", "RUN", "--src", "{in.txt}", "--ref", "{in.txt}", "--output", "{out}/out.txt"],
    "generate": ["generate", "--model", "RUN", "--prompt", "red dog"],
    "serve": ["serve", "--model", "RUN", "--port", "0"],
}
NO_CUDA = "no CUDA GPU is available here (torch.cuda.is_available() is False); use cpu"
BAD_DEVICES = {  # --device value: the message after "--device VALUE: "
    "bogus": "not a device; expected auto, cpu, cuda or cuda:N",
    "cuda:x": "not a device; expected auto, cpu, cuda or cuda:N",
    "mps": "mps devices are not supported; expected auto, cpu, cuda or cuda:N",
    "cuda": NO_CUDA,
    "cuda:99": NO_CUDA if not torch.cuda.is_available() else
    f"this machine has {torch.cuda.device_count()} CUDA GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}",
}


@pytest.mark.parametrize("device", list(BAD_DEVICES))
@pytest.mark.parametrize("command", list(DEVICE_COMMANDS))
def test_device_this_machine_lacks(command, device, cli, bad, trained):
    """Checked before anything is loaded or written: one line, not torch's traceback."""
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    argv = [a.replace("CONFIG", str(trained.config)).replace("{out}", str(bad["out"]))
            for a in _argv(DEVICE_COMMANDS[command], bad, trained.run)]
    r = cli(*argv, "--device", device)
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [f"transformer {command}: error: --device {device}: {BAD_DEVICES[device]}"]
    _untouched(bad["out"])


@pytest.mark.parametrize("case", ["model-not-a-mapping", "not-a-mapping", "decoding-not-a-mapping",
                                  "decoding-device-bogus", "decoding-device-cuda"])
def test_run_config_sections_of_the_wrong_kind(case, cli, bad, trained, tmp_path, one_line_error):
    """A run's config.yaml whose model: or decoding: section is not a mapping, or whose
    decoding.device this machine lacks: one line naming the file (train resuming it, or
    translate reading its decoding settings)."""
    import shutil

    if case == "decoding-device-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    broken = {"model-not-a-mapping": {**config, "model": 5}, "not-a-mapping": ["a", "b"],
              "decoding-not-a-mapping": {**config, "decoding": [1]},
              "decoding-device-bogus": {**config, "decoding": {"device": "bogus"}},
              "decoding-device-cuda": {**config, "decoding": {"device": "cuda"}}}[case]
    (run / "config.yaml").write_text(yaml.safe_dump(broken), encoding="utf-8")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    if case.startswith("decoding"):
        r = cli("translate", "--model", run, "--input", bad["in.txt"], "--output", bad["out"] / "out.txt")
        mentions = {"decoding-not-a-mapping": ["decoding must be a mapping"],
                    "decoding-device-bogus": ["decoding.device bogus: not a device", "give --device cpu"],
                    "decoding-device-cuda": ["decoding.device cuda: no CUDA GPU", "give --device cpu"]}[case]
        one_line_error(r, "translate", str(run / "config.yaml"), *mentions)
        _untouched(bad["out"])
    else:
        r = cli("train", "--config", trained.config, "--out", run)
        one_line_error(r, "train", str(run / "config.yaml"), "not a run config")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


# ---- evaluate and demo ----------------------------------------------------------------------

EVALUATE_CASES = {
    "missing-src": (["--src", "{in.txt}.nothere", "--ref", "{in.txt}"], ["in.txt.nothere"]),
    "ref-not-utf8": (["--src", "{latin1.txt}", "--ref", "{latin1.txt}"], ["latin1.txt:3:"]),
    "beam-0": (["--src", "{in.txt}", "--ref", "{in.txt}", "--beam", "0"], ["--beam"]),
    "precision-off-cpu": (["--src", "{in.txt}", "--ref", "{in.txt}", "--precision", "int8", "--device", "cuda"],
                          ["--precision" if torch.cuda.is_available() else "--device", "cuda"]),
    "corrupt-weights": (["--src", "{in.txt}", "--ref", "{in.txt}", "--model", "{corrupt.safetensors}"],
                        ["corrupt.safetensors"]),
}


@pytest.mark.parametrize("case", list(EVALUATE_CASES))
def test_evaluate_bad_input(case, cli, bad, trained, one_line_error):
    template, mentions = EVALUATE_CASES[case]
    argv = ["evaluate", "--model", str(trained.run), *_argv(template, bad, trained.run)]
    r = cli(*argv, "--output", bad["out"] / "out.txt")
    one_line_error(r, "evaluate", *mentions)
    _untouched(bad["out"])


def test_evaluate_broken_run_config(cli, bad, trained, one_line_error):
    """A weights file whose run folder holds an unreadable config.yaml (read for the target
    language of the tokenised BLEU): one line naming that file, no output written."""
    run = bad["out"].parent / "brokenrun"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.safetensors").write_bytes((trained.run / "best.safetensors").read_bytes())
    (run / "subwords.model").write_bytes((trained.run / "subwords.model").read_bytes())
    (run / "config.yaml").write_text("tgt_lang: [de\n", encoding="utf-8")
    r = cli("evaluate", "--model", run / "checkpoints" / "best.safetensors", "--src", bad["in.txt"],
            "--ref", bad["in.txt"], "--output", bad["out"] / "out.txt")
    one_line_error(r, "evaluate", "config.yaml")
    _untouched(bad["out"])


# ---- a --model that is no run, to the commands that read one model ---------------------------

def _not_runs(folder: Path) -> dict[str, tuple[Path, str]]:
    """id: (a --model path that is not a run, what the one line must tell the user to do)."""
    from safetensors.torch import save_file

    (folder / "notes.txt").write_text("red dog runs\n", encoding="utf-8")
    torch.save({"w": torch.zeros(2)}, folder / "checkpoint_best.pt")  # fairseq's name; never unpickled
    (folder / "empty").mkdir()
    (folder / "theirs").mkdir()  # someone else's files
    (folder / "theirs" / "README.md").write_text("# my project\n", encoding="utf-8")
    (folder / "theirs" / "train.de").write_text("Hallo\n", encoding="utf-8")
    (folder / "hf").mkdir()  # a Hugging Face model folder
    (folder / "hf" / "config.json").write_text('{"model_type": "marian"}', encoding="utf-8")
    save_file({"w": torch.zeros(2, 2)}, str(folder / "hf" / "model.safetensors"), metadata={"format": "pt"})
    save_file({"w": torch.zeros(2, 2)}, str(folder / "plain.safetensors"))
    run = "give a run directory"
    return {"text-file": (folder / "notes.txt", run), "pickle": (folder / "checkpoint_best.pt", run),
            "empty-folder": (folder / "empty", run), "someone-elses-folder": (folder / "theirs", run),
            "hugging-face-folder": (folder / "hf", f"transformer import {folder / 'hf'} --out RUN"),
            "plain-safetensors": (folder / "plain.safetensors", run)}


NOT_RUN_COMMANDS = {"info": [], "attention": ["red dog", "--focus", "red", "--to", "dog"], "explain": ["red dog"],
                    "lens": ["red dog"], "heads": ["red dog"], "export": ["--format", "ctranslate2"], "translate": [],
                    "generate": ["--prompt", "red"], "average": []}


@pytest.mark.parametrize("command", list(NOT_RUN_COMMANDS))
@pytest.mark.parametrize("case", ["text-file", "pickle", "empty-folder", "someone-elses-folder",
                                  "hugging-face-folder", "plain-safetensors"])
def test_a_model_that_is_no_run_is_one_line_saying_what_to_do(command, case, cli, tmp_path, one_line_error):
    """Each names the path and what to give instead, exits 2, and writes nothing."""
    models = tmp_path / "models"
    models.mkdir()
    path, remedy = _not_runs(models)[case]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = ["--out", tmp_path / "exported"] if command == "export" else []
    r = cli(command, "--model", path, *NOT_RUN_COMMANDS[command], *out, stdin="red dog\n")
    if command == "average":  # averages a run's checkpoints: nothing more to say than that there are none
        one_line_error(r, command, path, "no checkpoints")
    else:
        one_line_error(r, command, path, remedy)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", ["toy", "demo"])  # demo: toy's old name, kept unlisted
def test_toy_bad_steps(command, cli, one_line_error):
    one_line_error(cli(command, "--steps", "0"), command, "--steps")


# ---- usage errors and help --------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    ([], "transformer: error: the following arguments are required: COMMAND (see transformer --help)"),
    (["frobnicate"], "transformer: error: argument COMMAND: invalid choice: 'frobnicate'"),
    (["translate"], "transformer translate: error: the following arguments are required: --model"),
    (["translate", "--model", "x", "--beam", "two"], "transformer translate: error: argument --beam: invalid int "
                                                     "value: 'two'"),
    (["explain", "a dog", "--model", "A", "B"], "transformer explain: error: unrecognized arguments: B; text with "
                                                "spaces needs quotes (see transformer explain --help)"),
    (["explain", "--model", "x", "a", "dog"], "transformer explain: error: unrecognized arguments: dog;"),
    (["translate", "--model", "x", "--beam", "2", "y"], "transformer translate: error: unrecognized arguments: y "
                                                         "(see transformer translate --help)"),
    (["explain", "--model"], "transformer explain: error: argument --model: expected one argument"),
    (["explain", "a dog", "--model", "A", "--bogus"], "transformer explain: error: unrecognized arguments: --bogus "
                                                      "(see transformer explain --help)"),
])
def test_usage_errors_are_one_line(argv, says, cli):
    """A missing, unknown or badly typed argument is one line naming the command and what was
    wrong, with where to read more, like every other error (not argparse's usage block;
    arguments no option took are named with their command, not on the bare 'transformer')."""
    r = cli(*argv)
    assert r.code == 2, argv
    assert "Traceback" not in r.err and r.out == ""
    assert len(r.err.splitlines()) == 1, r.err
    assert r.err.startswith(says) and r.err.rstrip().endswith("--help)"), r.err


@pytest.mark.parametrize("argv, option", [
    (["generate", "--model", "", "--prompt", "a"], "--model"),
    (["info", "--model", " "], "--model"),
    (["explain", "--model", "", "a dog"], "--model"),
    (["translate", "--model", "run", "", "--input", "in.txt"], "--model"),
    (["translate", "--model", "run", "--output", ""], "--output"),
    (["translate", "--model", "run", "--input", ""], "--input"),
    (["evaluate", "--model", "run", "--text", ""], "--text"),
    (["evaluate", "--model", "run", "--src", "", "--ref", "r.txt"], "--src"),
    (["train", "--config", ""], "--config"),
    (["train", "--config", "c.yaml", "--out", ""], "--out"),
    (["average", "--model", "run", "--out", ""], "--out"),
    (["export", "--model", "run", "--format", "onnx", "--out", ""], "--out"),
    (["import", "hf", "--out", ""], "--out"),
])
def test_an_empty_path_is_one_line(argv, option, cli, one_line_error, tmp_path, monkeypatch):
    """An empty path ("$RUN" with RUN unset) is the current folder to the filesystem: a run
    folder there was used as --model, train --out '' trained into the default folder,
    translate --output '' wrote to stdout, export --out '' replaced an empty current folder.
    Refused for every command, before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    one_line_error(cli(*argv), argv[0], f"{option} is empty; give a path")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", [None, "toy", "demo", "train", "translate", "evaluate", "average", "attention",
                                     "explain", "lens", "heads", "serve", "export", "import", "info", "generate"])
def test_help_exits_0(command, cli):
    r = cli(*([command] if command else []), "--help")
    assert r.code == 0 and r.err == ""
    assert r.out.startswith(f"usage: transformer{' ' + command if command else ''}")
    if command is None:
        listed = re.findall(r"^    (\w+)", r.out, re.M)
        assert listed == ["train", "translate", "generate", "evaluate", "average", "attention", "explain", "lens",
                          "heads", "serve", "export", "import", "info", "toy"]  # not demo: configs/demo.yaml's name


def test_help_real_process(real_cli):
    done = real_cli("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: transformer") and done.stderr == ""


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES])
def test_a_write_the_machine_refuses_anywhere_is_one_line(code, cli, tmp_path, monkeypatch, one_line_error):
    """A full disk, a read-only one, a quota or a permission met where no writer catches it
    (here: where the run directory is made) is one line naming the file, exit 2; an OSError
    of another kind is a fault of the code and keeps its traceback."""
    import transformer.train.trainer as trainer

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "run" / "somewhere"))

    monkeypatch.setattr(trainer.Trainer, "__init__", refuse)
    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 1\n", encoding="utf-8")
    result = cli("train", "--config", config, "--out", tmp_path / "run")
    one_line_error(result, "train", "somewhere", os.strerror(code))
    assert result.code == 2

    monkeypatch.setattr(trainer.Trainer, "__init__", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(OSError):
        cli("train", "--config", config, "--out", tmp_path / "run")


# ---- YAML that expands without end --------------------------------------------------------

def _bounded(argv: list, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real command, its address space capped at 4 GB and its time at ``timeout``: a
    config that still expanded would fail the test, not take the machine's memory."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    return subprocess.run([TRANSFORMER, *map(str, argv)], capture_output=True, text=True, env=process_env(),
                          timeout=timeout, preexec_fn=cap)


@pytest.mark.parametrize("command", ["translate", "train"])
def test_a_config_alias_bomb_is_one_line(command, trained, bad, tmp_path):
    """Nine anchors of nine aliases each (387 million values expanded) in a run's config.yaml
    (translate) or a training config: translate spun at 100% to 5.7 GB printing the value. Now
    one line naming the file, before anything is loaded or written."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    config = run / "config.yaml" if command == "translate" else tmp_path / "bomb.yaml"
    good = yaml.safe_load((run / "config.yaml" if command == "translate" else trained.config).read_text())
    good.pop("decoding", None)
    config.write_text(yaml.safe_dump(good) + alias_bomb(), encoding="utf-8")
    argv = (["translate", "--model", run, "--input", bad["in.txt"], "--output", bad["out"] / "out.txt"]
            if command == "translate" else ["train", "--config", config, "--out", tmp_path / "new"])
    done = _bounded(argv)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    remedy = "restore it from the run, or give the options it would have supplied" if command == "translate" \
        else "correct it"
    assert done.stderr.splitlines() == [f"transformer {command}: error: {config}: not readable YAML (line 1, column "
                                        "1: its aliases (*name) repeat more than 100,000 values; write the values "
                                        f"out instead); {remedy}"]
    _untouched(bad["out"])
    assert not (tmp_path / "new").exists()


def test_a_set_value_alias_bomb_is_one_short_line(trained, tmp_path):
    """The same aliases given to --set: read as the text it is, refused in a line of its own size."""
    done = _bounded(["train", "--config", trained.config, "--out", tmp_path / "new", "--set",
                     f"decoding.alpha={alias_list()}"])
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith("transformer train: error: ") and "alpha must be a number, got '[&a0" in line
    assert len(line) < 200 and not (tmp_path / "new").exists()


# ---- weights that are not finite --------------------------------------------------------------

@pytest.mark.parametrize("command", ["translate", "attention"])
def test_weights_that_are_not_finite_are_one_line_naming_the_tensor(command, cli, bad, trained, tmp_path,
                                                                    one_line_error):
    """One NaN in a cross-attention bias: beam search found no finite hypothesis, and translate
    (and the service's /translate and /attention, which load through the same door) ended in an
    IndexError. Now the model is refused as it loads, naming the file and the tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    from transformer.errors import UserError
    from transformer.run.weights import read_metadata
    from transformer.inference.translator import load_translator

    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    weights = run / "best.safetensors"
    tensors, meta = load_file(str(weights)), read_metadata(weights)
    name = next(n for n in tensors if "cross_attn" in n and n.endswith("bias"))
    tensors[name][0] = float("nan")
    save_file(tensors, str(weights), metadata=meta)
    argv = (["--model", run, "--input", bad["in.txt"], "--output", bad["out"] / "out.txt"] if command == "translate"
            else ["red dog", "--model", run, "--out", bad["out"] / "out.png"])
    r = cli(command, *argv)
    one_line_error(r, command, f"{weights}: the weights are not finite: {name} holds 1 NaN or infinite value of ")
    _untouched(bad["out"])
    with pytest.raises(UserError, match=f"the weights are not finite: {re.escape(name)}"):
        load_translator(run)  # (what transformer serve loads)
