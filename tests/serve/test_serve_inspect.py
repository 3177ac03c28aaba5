"""/lens and /heads: the logit lens and the head map of one sentence, for both kinds of model.

An answer is what the inspect functions give for the same sentence on the same model (the lens
of the translation the server decodes greedily, each head's change of the score), and what
``transformer heads --json`` prints for the same request. Bad input is refused in one line:
an unknown token, a layer the model lacks, "vs" without "token", "ablate" with "corrupt" (422);
a text over the characters, over the tokens the model reads, over the lens's logits or the
heads x positions the server runs (413, before the pass that would cost it).
"""
from __future__ import annotations

import json
import math
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from starlette.testclient import TestClient

from transformer import ModelConfig
from transformer.data.chars import Chars
from transformer.inference.generator import Generator
from transformer.inspect import Score, head_effects, logit_lens
from transformer.model import LanguageModel
from transformer.serve import ServeConfig, create_app

CHARS = Chars(list(string.ascii_lowercase + " .\n"))
TRANSFORMER = str(Path(sys.executable).with_name("transformer"))


@pytest.fixture(scope="module")
def lm() -> Generator:
    """An untrained character model, 2 layers x 2 heads, context 32 (its weights do not matter)."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("nanogpt-char", vocab_size=CHARS.vocab_size, d_model=16, n_heads=2, d_ff=32,
                             n_layers=2, max_len=32)
    return Generator(LanguageModel(cfg).eval(), CHARS, warn=False)


def client(front, **settings) -> TestClient:
    return TestClient(create_app(front, ServeConfig(**{"max_chars": 100, **settings}), model_name="t"))


@pytest.fixture(scope="module")
def tr(run_dir):
    """The translation app in-process, fp32 (the server's greedy translator is the commands')."""
    from transformer.inference.translator import load_translator

    translator = load_translator(run_dir, precision="fp32", beam=1, compile="off", warn=False)
    with client(translator, max_chars=200) as http:
        yield translator, http


def test_lm_lens_is_the_models_lens(lm):
    with client(lm) as http:
        r = http.post("/lens", json={"text": "the cat sat", "top": 2, "layers": [2, 0]})
    assert r.status_code == 200, r.text
    got = r.json()
    ids = torch.tensor([CHARS.encode("the cat sat")])
    want = logit_lens(lm.model, ids, real=torch.ones_like(ids, dtype=torch.bool))
    assert got["layers"] == ["2", "embed"] and got["n_layers"] == 2 and got["truncated"] is False
    assert len(got["positions"]) == 11
    for row, r_ in zip(got["final_choice_prob"], [2, 0]):
        assert row == pytest.approx(want.chosen_prob[r_].tolist(), abs=1e-4)
    probs, top = want.top(2)
    assert [p for cell in got["top"][0] for _, p in cell] == pytest.approx(probs[2].flatten().tolist(), abs=1e-4)
    assert got["top"][0][0][0][0] == CHARS.decode([int(top[2, 0, 0])]).replace(" ", "▁")


def test_lm_heads_are_the_models_head_effects_and_a_layer_not_measured_is_null(lm):
    with client(lm) as http:
        r = http.post("/heads", json={"text": "the cat sat", "layers": [1]})
    assert r.status_code == 200, r.text
    got = r.json()
    ids = torch.tensor([CHARS.encode("the cat sat")])
    real = torch.ones_like(ids, dtype=torch.bool)
    nxt = int(lm.model(ids, real=real)[0, -1].argmax())
    want = head_effects(lm.model, (ids,), Score([10], [nxt]), layers=[1], real=real)
    assert got["mode"] == "zero" and got["n_heads"] == 2
    (kind,) = got["kinds"]
    assert kind["kind"] == "dec.attn" and kind["effects"][0] == [None, None]
    assert kind["effects"][1] == pytest.approx(want.effects["dec.attn"][1].tolist(), abs=1e-5)
    assert got["clean"] == pytest.approx(want.clean, abs=1e-5)


def test_a_long_lm_text_is_read_from_its_end_as_attention_reads_it(lm):
    text = "the cat sat. " * 4  # 52 characters, the context is 32
    with client(lm) as http:
        got = http.post("/lens", json={"text": text}).json()
    assert got["truncated"] is True and "".join(got["positions"]) == text[-32:].replace(" ", "▁")


def test_translation_lens_and_patched_heads_are_the_commands(tr, run_dir):
    translator, http = tr
    text, corrupt = "the dog sees the cat", "the man sees the cat"
    lens = http.post("/lens", json={"text": text}).json()
    assert lens["translation"] == translator.translate([text])[0]
    assert lens["positions"][0] == "<s>" and lens["final_choice"][-1] == "</s>"
    assert len(lens["layers"]) == translator.model.cfg.n_layers + 1
    assert all(len(row) == len(lens["positions"]) for row in lens["final_choice_prob"])
    assert lens["final_choice_prob"][-1] == pytest.approx([max(cell[1] for cell in cells)
                                                           for cells in lens["top"][-1]], abs=1e-4)
    r = http.post("/heads", json={"text": text, "corrupt": corrupt})
    assert r.status_code == 200, r.text
    heads = r.json()
    cli = subprocess.run([TRANSFORMER, "heads", "--model", str(run_dir), text, "--corrupt", corrupt, "--json"],
                         capture_output=True, text=True, check=True)
    want = json.loads(cli.stdout)
    assert heads["mode"] == want["mode"] == "patch" and heads["score"] == want["score"]
    assert heads["clean"] == pytest.approx(want["clean"], abs=1e-4)
    assert heads["corrupt"] == pytest.approx(want["corrupt"], abs=1e-4)
    assert [k["label"] for k in heads["kinds"]] == list(want["effects"])
    for kind in heads["kinds"]:
        assert kind["effects"] == [pytest.approx(row, abs=1e-4) for row in want["effects"][kind["label"]]]


REFUSED = [
    ("/heads", {"text": "the dog runs", "token": "qqqqzzzz"}, 422, '"token" qqqqzzzz is'),
    ("/heads", {"text": "the dog runs", "layers": [9]}, 422, "layers: 9 is out of range; the model has"),
    ("/lens", {"text": "the dog runs", "layers": [9]}, 422, "layers: 9 is out of range; the lens has"),
    ("/heads", {"text": "the dog runs", "vs": "die"}, 422, '"vs" needs "token"'),
    ("/heads", {"text": "the dog runs", "corrupt": "the cat runs", "ablate": "mean"}, 422, '"ablate" is for'),
    ("/heads", {"text": "the dog runs", "ablate": "half"}, 422, "ablate: Input should be 'zero' or 'mean'"),
    ("/lens", {"text": "  "}, 422, "text: only white space"),
    ("/lens", {"text": "the dog runs", "top": 11}, 422, "top: Input should be less than or equal to 10"),
    ("/lens", {"text": "dog " * 51}, 413, "text: 204 characters; the limit is 200"),
    ("/lens", {"text": "dog " * 49}, 413, "tokens, more than the model reads"),
    ("/heads", {"text": "the dog runs", "corrupt": "dog " * 49}, 413, "corrupt: "),
]


@pytest.mark.parametrize("path, body, status, message", REFUSED, ids=[m for *_, m in REFUSED])
def test_bad_requests_are_refused_in_one_line(tr, path, body, status, message):
    r = tr[1].post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error and "\n" not in error and "Traceback" not in error


def test_the_work_bounds_refuse_before_the_pass(lm, monkeypatch):
    import transformer.inspect as inspect_pkg

    monkeypatch.setattr(inspect_pkg, "logit_lens", lambda *a, **k: pytest.fail("the lens was computed"))
    monkeypatch.setattr(inspect_pkg, "head_effects", lambda *a, **k: pytest.fail("the heads were measured"))
    # the lens: 3 rows x 11 positions x 32 tokens = 1,056 logits; the heads: 4 heads x 11 positions = 44
    with client(lm, max_lens=1055, max_head_work=43) as http:
        r = http.post("/lens", json={"text": "the cat sat"})
        assert r.status_code == 413
        assert r.json()["error"] == ("text: the lens of 11 positions computes 1,056 logits (3 rows x 11 positions x 32 "
                                     "tokens); this server computes at most 1,055 (its --max-lens): send a shorter text")
        r = http.post("/heads", json={"text": "the cat sat"})
        assert r.status_code == 413
        assert r.json()["error"] == ('text: the head map runs 4 heads over 11 positions (44); this server runs at most '
                                     '43 for one answer (its --max-head-work): ask for fewer "layers" (e.g. "layers": '
                                     '[0]), or send a shorter text')
    monkeypatch.undo()
    with client(lm, max_lens=1056, max_head_work=44) as http:  # at the bound: answered
        assert http.post("/lens", json={"text": "the cat sat"}).status_code == 200
        assert http.post("/heads", json={"text": "the cat sat"}).status_code == 200


def test_the_settings_must_be_positive():
    for name in ("max_lens", "max_head_work"):
        with pytest.raises(ValueError, match=f"{name} must be positive"):
            ServeConfig(**{name: 0})


def test_nan_never_reaches_the_json(lm):
    with client(lm) as http:
        text = http.post("/heads", json={"text": "the cat sat", "layers": [0]}).text
    assert "NaN" not in text and not any(isinstance(v, float) and math.isnan(v)
                                         for k in json.loads(text)["kinds"] for row in k["effects"] for v in row)
