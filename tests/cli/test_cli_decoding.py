"""One decoding config: declared once (decode/decoding_config.py), validated once, shared by the
Python API and every command; a run's config.yaml may carry the settings its recipe was
tuned with, which a command without flags uses and each flag overrides."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from transformer import hardware
from transformer.cli import build_parser
from transformer.errors import UserError
from transformer.decode.decoding_config import FIELDS, DecodingConfig
from transformer.inference.translator import Translator, load_translator, run_decoding

LINES = ["red dog runs", "the big cat sits under the tree", "a woman plays with a ball near the house", "green ball"]


@pytest.fixture
def run_with(trained, tmp_path):
    """A copy of the trained run whose config.yaml has the given ``decoding`` section."""
    def make(decoding) -> str:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(trained.run, run)
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg["decoding"] = decoding
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
        return run

    return make


@pytest.mark.parametrize("bad, field", [(dict(beam=0), "beam"), (dict(beam=2, n_best=3), "n_best"),
                                        (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                                        (dict(temperature=-1.0), "temperature"), (dict(top_k=-1), "top_k"),
                                        (dict(max_tokens=0), "max_tokens"), (dict(precision="fp8"), "precision"),
                                        (dict(precision="int8", device="cuda"), "precision"),
                                        (dict(seed=-2), "seed"), (dict(max_len_b=-1), "max_len_b"),
                                        (dict(alpha=float("nan")), "alpha"), (dict(alpha=float("inf")), "alpha"),
                                        (dict(temperature=float("inf")), "temperature")])
def test_bad_settings_name_their_field(bad, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        DecodingConfig(**bad)


@pytest.mark.parametrize("bad, message", [
    (dict(beam=2.5), "beam must be an integer, got 2.5"),  # was "beam must be at least 1, got 2.5"
    (dict(beam=2.0), "beam must be an integer, got 2.0"),
    (dict(beam="abc"), "beam must be an integer, got 'abc'"),
    (dict(beam=True), "beam must be an integer, got True"),
    (dict(n_best=1.5), "n_best must be an integer, got 1.5"),
    (dict(max_len_b=2.5), "max_len_b must be an integer, got 2.5"),  # was "must not be negative, got 2.5"
    (dict(max_new_tokens=9.5), "max_new_tokens must be an integer, got 9.5"),
    (dict(top_k=1.5), "top_k must be an integer, got 1.5"),
    (dict(seed=1.5), "seed must be an integer, got 1.5"),
    (dict(max_tokens=10.5), "max_tokens must be an integer, got 10.5"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
])
def test_a_setting_of_the_wrong_type_says_what_it_must_be(bad, message):
    with pytest.raises(ValueError) as e:
        DecodingConfig(**bad)
    assert str(e.value) == message


def test_a_non_integer_decoding_setting_is_one_line_in_a_train_config_and_a_run_config(
        run_with, trained, cli, tmp_path, one_line_error):
    r = cli("train", "--config", trained.config, "--out", tmp_path / "new", "--set", "decoding.beam=2.5")
    one_line_error(r, "train", "config: decoding.beam must be an integer, got 2.5")
    config = tmp_path / "beam.yaml"
    config.write_text(trained.config.read_text() + "decoding:\n  beam: 2.5\n")
    one_line_error(cli("train", "--config", config, "--out", tmp_path / "new"), "train",
                   "config: decoding.beam must be an integer, got 2.5")
    assert not (tmp_path / "new").exists()
    run = run_with({"beam": 2.5})
    one_line_error(cli("translate", "--model", run, stdin="red dog\n"), "translate", "config.yaml",
                   "beam must be an integer, got 2.5")


def test_defaults_and_integers_for_floats():
    d = DecodingConfig(alpha=1, temperature=0)
    assert (d.beam, d.n_best, d.alpha, d.temperature) == (4, 1, 1.0, 0.0)
    assert isinstance(d.alpha, float) and d.to_dict() == {**FIELDS, "alpha": 1.0, "temperature": 0.0}


def test_the_config_is_three_parts_of_one_concern_each():
    """Search, sampling and runtime settings are parts of their own, each validated alone;
    the flat config is their union, in that order, and gives each part back."""
    from transformer.decode.decoding_config import RuntimeConfig, SamplingConfig, SearchConfig

    d = DecodingConfig(beam=2, alpha=1, top_k=5, compile="off")
    assert d.search == SearchConfig(beam=2, alpha=1.0)
    assert d.sampling == SamplingConfig(top_k=5)
    assert d.runtime == RuntimeConfig(compile="off")
    parts = [f for part in (SearchConfig, SamplingConfig, RuntimeConfig) for f in part.__dataclass_fields__]
    assert list(FIELDS) == parts
    with pytest.raises(ValueError, match="^n_best "):
        SearchConfig(beam=2, n_best=3)
    with pytest.raises(ValueError, match="^top_p "):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="^compile "):
        RuntimeConfig(compile="yes")


def test_the_runs_settings_are_used_and_flags_override_them(run_with):
    run = run_with({"beam": 1, "alpha": 1.0})
    assert run_decoding(run) == DecodingConfig(beam=1, alpha=1.0)
    assert run_decoding(run, {"beam": 3}) == DecodingConfig(beam=3, alpha=1.0)
    assert load_translator(run).decoding.beam == 1
    # a translator holds what auto resolved to here: the precision on this CPU, the device, the batch size
    assert Translator.from_pretrained(run, beam=2).decoding == DecodingConfig(
        beam=2, alpha=1.0, precision=hardware.resolve("auto"), device="cpu", max_tokens=4000)


def test_translate_without_flags_decodes_as_the_run_says(run_with, trained, cli):
    run = run_with({"beam": 1})
    greedy = load_translator(trained.run, beam=1).translate(LINES)
    beam4 = load_translator(trained.run, beam=4).translate(LINES)
    assert greedy != beam4  # the control: the two searches differ on these lines
    stdin = "".join(line + "\n" for line in LINES)
    assert cli("translate", "--model", run, stdin=stdin).out.splitlines() == greedy
    assert cli("translate", "--model", run, "--beam", "4", stdin=stdin).out.splitlines() == beam4
    assert cli("translate", "--model", trained.run, stdin=stdin).out.splitlines() == beam4  # no section: beam 4


def test_evaluate_reports_the_settings_it_used(run_with, trained, cli, tmp_path):
    run = run_with({"beam": 2, "alpha": 1.0})
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(line + "\n" for line in LINES))
    ref.write_text("".join(line + "\n" for line in LINES))
    out = json.loads(cli("evaluate", "--model", run, "--src", src, "--ref", ref, "--json").out)
    # the precision it used: auto resolved for this CPU
    assert (out["beam"], out["alpha"], out["precision"]) == (2, 1.0, hardware.resolve("auto"))
    out = json.loads(cli("evaluate", "--model", run, "--src", src, "--ref", ref, "--json", "--alpha", "0.2").out)
    assert (out["beam"], out["alpha"]) == (2, 0.2)


@pytest.mark.parametrize("argv, option", [(["--beam", "0"], "--beam"), (["--n-best", "9"], "--n-best"),
                                          (["--max-tokens", "0"], "--max-tokens"), (["--precision", "x"], "--precision"),
                                          (["--alpha", "nan"], "--alpha")])
def test_bad_flags_are_one_line_errors_naming_the_option(trained, cli, one_line_error, argv, option):
    one_line_error(cli("translate", "--model", trained.run, *argv, stdin="red dog\n"), "translate", option)


def test_a_beam_larger_than_the_vocabulary_is_refused_before_decoding(run_with, trained, cli):
    """A beam can hold no more hypotheses than the target vocabulary has tokens; --beam 10**9
    (or decoding.beam in a run's config.yaml) took all the memory and ended in a traceback."""
    vocab = load_translator(trained.run).model.cfg.target_vocab_size
    expected = (f"beam 1000000000 is larger than the model's target vocabulary ({vocab} tokens), the most "
                f"hypotheses a beam can hold; give --beam {vocab} or less (a beam of 4 to 10 is usual)")
    for argv, model in ((["--beam", "1000000000"], trained.run), ([], run_with({"beam": 10**9}))):
        for command in (["translate"], ["evaluate", "--src", trained.corpus["valid_src"], "--ref",
                                        trained.corpus["valid_tgt"]]):
            r = cli(*command, "--model", model, *argv, stdin="red dog\n")
            assert (r.code, r.err.splitlines()) == (2, [f"transformer {command[0]}: error: {expected}"])
    translator = load_translator(trained.run, beam=vocab)  # the largest beam decodes
    assert len(translator.translate_nbest(["red dog"], vocab)[0]) == vocab
    with pytest.raises(UserError, match=f"^beam {vocab + 1} is larger"):
        translator.with_decoding(beam=vocab + 1)


def test_a_bad_decoding_section_names_the_run_config(run_with, cli, one_line_error):
    run = run_with({"beam": 0})
    one_line_error(cli("translate", "--model", run, stdin="red dog\n"), "translate", "config.yaml", "beam")
    run = run_with({"bream": 5})
    one_line_error(cli("evaluate", "--model", run, "--src", "x", "--ref", "x"), "evaluate", "config.yaml")


@pytest.mark.parametrize("command", ["translate", "evaluate", "serve", "attention", "explain"])
def test_help_shows_every_decoding_default(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    text = " ".join(sub.format_help().split())
    for action in sub._actions:
        if action.dest in FIELDS:
            assert f"default: the run's decoding.{action.dest}, else {FIELDS[action.dest]}" in text, action.dest
    assert "--beam" in text


# (a step built with the GEMM timing: tests/decode/test_search_compiled.py)
@pytest.mark.parametrize("beam", ["1", "4"])
def test_translate_compile_on_builds_the_step_once_and_later_commands_use_it(trained, tmp_path, cli, one_line_error,
                                                                             beam, without_gemm_timing, monkeypatch):
    from transformer.compiled import build as aot, packages
    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    stdin = "".join(line + "\n" for line in LINES)
    eager = cli("translate", "--model", run, "--beam", beam, "--compile", "off", stdin=stdin)
    built = cli("translate", "--model", run, "--beam", beam, "--compile", "on", stdin=stdin)
    assert built.out == eager.out
    # one line says why this command takes longer; no compiler chatter
    assert built.err.splitlines() == ["compiling the decoding step (a minute or a few, once: it is kept in your "
                                      "cache)"] + eager.err.splitlines()
    kind = "search-greedy" if beam == "1" else f"search-beam{beam}"
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[hardware.resolve("auto")]  # the default precision: auto
    assert [p.name.rsplit("-", 1)[0] for p in packages.run_folder(run).glob("*.pt2")] == [f"{kind}-{dtype}"]

    # later commands load it, by default too (auto), and build nothing
    loads = []
    monkeypatch.setattr(aot, "build", lambda *a: pytest.fail("built again"))
    monkeypatch.setattr(aot, "load", lambda path, load=aot.load: loads.append(path) or load(path))
    for compile in ("on", None):
        again = cli("translate", "--model", run, "--beam", beam, *(["--compile", compile] if compile else []),
                    stdin=stdin)
        assert (again.out, again.err) == (eager.out, eager.err)
    assert len(loads) == 2
    # another search kind has no step yet: auto decodes eagerly, without building one
    other = "4" if beam == "1" else "1"
    cli("translate", "--model", run, "--beam", other, stdin=stdin)
    assert len(loads) == 2 and len(list(packages.run_folder(run).glob("*.pt2"))) == 1
    one_line_error(cli("translate", "--model", run, "--compile", "always", stdin="red dog\n"), "translate", "--compile")
