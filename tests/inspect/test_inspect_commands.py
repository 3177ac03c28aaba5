"""``transformer lens`` and ``transformer heads`` on a translation run and an imported GPT-2 run
(both tiny, built in the test): what they print, the PNG and JSON they write, and bad input
(a token the vocabulary lacks or splits, a sentence over the model's limits, a layer that does
not exist) refused in one line with exit 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.cli import main
from transformer.data.subwords import train_subwords
from transformer.inspect import Score, head_effects, logit_lens
from transformer.run import save_weights
from transformer.inference.translator import load_translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))  # tiny Hugging Face checkpoints

TEXTS = ["The animal didn't cross the street because it was too tired.", "A dog runs in the park with a ball.",
         "Das Tier überquerte die Straße nicht, weil es zu müde war.", "Ein Hund läuft über die Straße.",
         "Zwei Kinder spielen in der Nähe des Wassers.", "Two children are playing near the water."]

SENTENCE = "The animal didn't cross the street because it was too tired."
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A random translation run (2+2 layers, 2 heads, d_model 16, max_len 40)."""
    root = tmp_path_factory.mktemp("inspect-run")
    subwords = train_subwords(TEXTS * 3, root / "subwords", vocab_size=120)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=subwords.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                      max_len=40)
    save_weights(Transformer(cfg).eval(), root / "best.safetensors")
    return root


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from hf_checkpoints import build_checkpoint

    root = tmp_path_factory.mktemp("inspect-gpt2")
    folder, _ = build_checkpoint("gpt2", root / "hf")
    assert main(["import", str(folder), "--out", str(root / "run")]) == 0
    return root / "run"


def call(capsys, *argv):
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_lens_prints_every_layer_and_draws_the_png(run, tmp_path, capsys):
    out_png = tmp_path / "lens.png"
    code, out, err = call(capsys, "lens", SENTENCE, "--model", run, "--target", "Das Tier ist müde.", "--out",
                          out_png, "--device", "cpu")
    assert code == 0, err
    assert out.startswith("source:      The animal")
    assert "position 1 reads '<s>'" in out and "layer 2  p(final)" in out
    assert out_png.read_bytes().startswith(PNG)
    code, out, _ = call(capsys, "lens", SENTENCE, "--model", run, "--target", "Das Tier", "--json", "--layer", "2",
                        "--device", "cpu")
    data = json.loads(out)
    translator = load_translator(run, warn=False, precision="fp32", device="cpu")
    ids = [1, *translator.subwords.encode("Das Tier")]
    lens = logit_lens(translator.model, torch.tensor([translator.encode(SENTENCE)]), torch.tensor([ids]))
    assert [layer["layer"] for layer in data["layers"]] == ["2"]
    assert data["layers"][0]["final_choice_prob"] == [round(float(p), 5) for p in lens.chosen_prob[-1]]


def test_heads_table_json_and_png(run, tmp_path, capsys):
    out_png = tmp_path / "heads.png"
    code, out, err = call(capsys, "heads", SENTENCE, "--model", run, "--target", "Das Tier ist müde.", "--out",
                          out_png, "--device", "cpu")
    assert code == 0, err
    assert "encoder self-attention" in out and "cross-attention" in out and "largest:" in out
    assert out_png.read_bytes().startswith(PNG)
    translator = load_translator(run, warn=False, precision="fp32", device="cpu")
    tgt = torch.tensor([[1, *translator.subwords.encode("Das Tier ist müde.")]])
    token = int(tgt[0, 3])  # a piece of the translation, given by its own spelling
    code, out, err = call(capsys, "heads", SENTENCE, "--model", run, "--target", "Das Tier ist müde.", "--json",
                          "--corrupt", "The animal didn't cross the street because it was too wide.", "--token",
                          translator.subwords.id_to_piece(token), "--device", "cpu")
    assert code == 0, err
    data = json.loads(out)
    assert data["mode"] == "patch" and set(data["effects"]) >= {"decoder self-attention", "cross-attention"}
    # the numbers are the API's
    found = head_effects(translator.model, (torch.tensor([translator.encode(SENTENCE)]), tgt), Score([2], [token]),
                         ablate="patch", corrupt=(torch.tensor([translator.encode(SENTENCE.replace("tired", "wide"))]),
                                                  tgt))
    assert data["effects"]["cross-attention"] == [[round(float(v), 6) for v in row]
                                                  for row in found.effects["dec.cross"]]


def test_lens_and_heads_on_an_imported_gpt2(gpt2_run, tmp_path, capsys):
    code, out, err = call(capsys, "lens", "Hello world, the quick", "--model", gpt2_run, "--out", tmp_path / "l.png")
    assert code == 0, err
    assert out.startswith("prompt: 'Hello world, the quick'")
    code, out, err = call(capsys, "heads", "Hello world, the quick", "--model", gpt2_run, "--ablate", "mean",
                          "--token", "brown", "--vs", "lazy")
    assert code == 0, err
    assert "self-attention" in out and "log p(" in out


@pytest.mark.parametrize("argv, message", [
    (["heads", "--token", "你"], "--token 你 is not in the model's vocabulary"),
    (["heads", "--token", "Tier"], "--token Tier is 3 tokens (▁T i er), not one; give a single token"),
    (["heads", "--vs", "es"], "--vs needs --token"),
    (["heads", "--layer", "3"], "--layer 3 is out of range: the model has 2 layers (1..2)"),
    (["lens", "--layer", "7"], "--layer 7 is out of range: the model has 2 layers (1..2)"),
    (["heads", "--corrupt", "x", "--ablate", "zero"], "--ablate is for ablation"),
    (["lens", "--out", "lens.jpg"], "name it .png"),
])
def test_bad_input_is_one_line(run, capsys, argv, message):
    command, *rest = argv
    code, out, err = call(capsys, command, SENTENCE, "--model", run, "--target", "Das Tier", "--device", "cpu", *rest)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("command", ["lens", "heads"])
def test_a_sentence_over_the_limits_is_refused(run, capsys, command):
    code, _, err = call(capsys, command, "the street " * 40, "--model", run, "--device", "cpu")
    assert code == 2 and err.count("\n") == 1
    assert "longer than the model's max_len of 40; shorten it" in err


def test_a_lm_corrupted_sentence_of_another_length_is_refused(gpt2_run, capsys):
    code, _, err = call(capsys, "heads", "Hello world", "--model", gpt2_run, "--corrupt", "Hello world, the quick")
    assert code == 2 and err.count("\n") == 1 and "patching a language model reads both at the same positions" in err
