"""Generation from a language-model run, from Python (two lines) and the command line:
streaming, seeds, greedy, prompts longer than the context, the article's matrices listed, and
bad values as one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from transformer.cli import main
from transformer.decode import generate
from transformer.inference.generator import Generator
from transformer.run import load_model


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_two_lines_from_a_run_directory(trained_lm):
    generator = Generator.from_pretrained(trained_lm, temperature=0, max_new_tokens=20)
    text = generator.generate(["the cat"])[0]
    model, _ = load_model(trained_lm)
    ids = generate(model, [generator.tokenizer.encode("the cat")], 20, temperature=0)[0]
    assert text == generator.tokenizer.decode(ids) and len(text) == 20
    assert set(text) <= set("the a cat dog sat ran on under mat log and then quickly slowly.\n ")


def test_generate_command_streams_the_prompt_and_its_continuation(trained_lm, capsys):
    code, out, err = run_cli(capsys, "generate", "--model", trained_lm, "--prompt", "the dog", "--temperature", "0",
                             "--max-new-tokens", "25")
    assert code == 0 and err == ""
    expected = Generator.from_pretrained(trained_lm, temperature=0, max_new_tokens=25).generate(["the dog"])[0]
    assert out == "the dog" + expected + "\n"


def test_the_same_seed_gives_the_same_samples(trained_lm, capsys):
    argv = ("generate", "--model", trained_lm, "--prompt", "a", "--seed", "3", "--max-new-tokens", "30",
            "--num-samples", "3")
    first = run_cli(capsys, *argv)[1]
    assert run_cli(capsys, *argv)[1] == first
    samples = first.split("\n" + "-" * 15 + "\n")[:3]
    assert len(set(samples)) == 3  # three different samples
    # sample n is seed + n: the rows of one batch with seed 3
    gen = Generator.from_pretrained(trained_lm, seed=3, max_new_tokens=30)
    assert ["a" + t for t in gen.generate(["a", "a", "a"])] == samples



def test_seed_help_offers_no_value_the_option_refuses(capsys):
    """--seed takes an integer only: its help must not offer "none" as a value."""
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    seed = text.split("--seed S random seed", 1)[1].split("--precision P", 1)[0]
    assert "without one, a fresh one each run" in seed and "none:" not in seed
    with pytest.raises(SystemExit) as done:
        main(["generate", "--model", "x", "--seed", "none"])
    assert done.value.code == 2 and "invalid int value: 'none'" in capsys.readouterr().err

def test_prompt_from_stdin_and_a_long_prompt_is_cut_from_the_left(trained_lm):
    long = "the cat sat on the mat and then the dog ran under the log. " * 3  # > context 16
    done = subprocess.run([sys.executable, "-m", "transformer", "generate", "--model", str(trained_lm),
                           "--temperature", "0", "--max-new-tokens", "5"], input=long, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "prompt is longer than the model's context" in done.stderr
    gen = Generator.from_pretrained(trained_lm, temperature=0, max_new_tokens=5, warn=False)
    assert done.stdout == long.rstrip("\n") + gen.generate([long.rstrip("\n")])[0] + "\n"
    assert gen.truncated == 1


@pytest.mark.parametrize("argv, option", [(["--temperature", "-1"], "--temperature"), (["--top-p", "0"], "--top-p"),
                                          (["--top-p", "1.5"], "--top-p"), (["--top-k", "-1"], "--top-k"),
                                          (["--max-new-tokens", "0"], "--max-new-tokens"),
                                          (["--num-samples", "0"], "--num-samples")])
def test_bad_values_are_one_line_errors(trained_lm, capsys, argv, option):
    code, out, err = run_cli(capsys, "generate", "--model", trained_lm, "--prompt", "a", *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("transformer generate: error: ") and option in err


def test_a_translation_model_is_refused(tmp_path, capsys):
    from transformer import ModelConfig, Transformer
    from transformer.run import save_weights

    save_weights(Transformer(ModelConfig.preset("toy", vocab_size=20)), tmp_path / "m.safetensors")
    code, _, err = run_cli(capsys, "generate", "--model", tmp_path / "m.safetensors", "--prompt", "a")
    assert code == 2 and "a translation model" in err


def test_info_lists_the_seeds_matrices(trained_lm, capsys):
    code, out, _ = run_cli(capsys, "info", "--model", trained_lm, "--json")
    info = json.loads(out)
    names = [m["name"] for m in info["matrices"]]
    assert names[0] == "We" and names[-1] == "Whead" and "layer 1 WQ" in names and "layer 1 W_down" in names
    model, _ = load_model(trained_lm)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    by_name = {m["name"]: m for m in info["matrices"]}
    assert by_name["layer 1 WQ"]["shape"] == [32, 32] and by_name["layer 1 W_up"]["shape"] == [64, 32]
    assert run_cli(capsys, "info", "--model", trained_lm)[1].count("layer 1 W") == 6  # WQ WK WV WO W_up W_down


def test_greedy_generation_matches_a_plain_loop_on_the_trained_model(trained_lm):
    model, _ = load_model(trained_lm)
    seq = [5, 6, 7]
    out = generate(model, [seq], 8, temperature=0)[0]
    for t in out:
        assert t == int(model(torch.tensor([seq]))[0, -1].argmax())
        seq = seq + [t]


def test_a_seed_past_what_torch_takes_is_one_line(trained_lm, capsys):
    """--seed 2**64 (or a run's decoding.seed as large) was a ValueError traceback from
    torch's generator after the prompt was printed; it is refused, naming the limit, and
    the largest seed allowed still samples, sample n with seed + n."""
    code, out, err = run_cli(capsys, "generate", "--model", trained_lm, "--prompt", "a", "--seed", 2**64,
                             "--max-new-tokens", "3")
    assert code == 2 and out == ""
    assert err.startswith("transformer generate: error: --seed must be a non-negative integer, at most "
                          f"{2**63 - 1}") and "Traceback" not in err
    code, out, err = run_cli(capsys, "generate", "--model", trained_lm, "--prompt", "a", "--seed", 2**63 - 1,
                             "--max-new-tokens", "3", "--num-samples", "2")
    assert code == 0, err


def test_a_prompt_argument_that_is_not_utf8_says_so(trained_lm, capsys):
    """Bytes that are not UTF-8 in --prompt (a Latin-1 terminal) arrive as lone surrogates:
    the character model said "character '\\udce9' is not in the character vocabulary" and a
    Hugging Face tokenizer raised TypeError; it is one line naming the byte."""
    code, out, err = run_cli(capsys, "generate", "--model", trained_lm, "--prompt", "the caf\udce9",
                             "--max-new-tokens", "3")
    assert code == 2 and out == ""
    assert err == ("transformer generate: error: --prompt is not UTF-8 (byte 0xe9 at character 8); give UTF-8 text "
                   "(a Latin-1 terminal or file: convert it, e.g. `iconv -f latin1 -t utf-8`)\n")


def test_explain_text_that_is_not_utf8_says_so(trained_lm, capsys):
    """The same check serves every command's text (explain's sentence here), while a path
    option is left as it is: a file name need not be UTF-8."""
    code, out, err = run_cli(capsys, "explain", "--model", trained_lm, "the caf\udce9")
    assert code == 2 and out == ""
    assert err.startswith("transformer explain: error: the sentence is not UTF-8 (byte 0xe9 at character 8)")
    from transformer.cli import _refuse_undecodable_text, build_parser

    explain = build_parser().commands["explain"]
    _refuse_undecodable_text(explain.parse_args(["--model", "caf\udce9", "a"]), explain)  # no error: a path
