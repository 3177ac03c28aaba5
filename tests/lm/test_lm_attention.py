"""``transformer attention`` on a language model: the causal self-attention of a prompt, drawn
(PNG and HTML) from the weights that give the model's logits, and its heads ranked for
"it" -> "animal"."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from transformer.cli import main
from transformer.inference.generator import Generator
from transformer.model.masks import causal_mask
from transformer.model.rotary import apply_rotary
from transformer.viz.heatmap import draw_attention
from transformer.viz.maps import collect_prompt_attention, rank_heads
from transformer.viz.walkthrough_lm import token_shower

PROMPT = "a cat sat on it"  # 15 characters: the toy context is 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))  # tiny Hugging Face checkpoints
from hf_checkpoints import build_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def maps(trained_llama):
    gen = Generator.from_pretrained(trained_llama, precision="fp32")
    ids = gen.tokenizer.encode(PROMPT)
    show = token_shower(gen.tokenizer)
    return collect_prompt_attention(gen.model, PROMPT, ids, [show(i) for i in ids])


def test_the_weights_are_causal_and_the_models(maps, trained_llama):
    gen = Generator.from_pretrained(trained_llama, precision="fp32")
    T = len(PROMPT)
    assert maps.self_attn.shape == (2, 2, T, T) and maps.pieces[1] == "▁"
    assert float(torch.triu(maps.self_attn, diagonal=1).abs().max()) == 0.0
    torch.testing.assert_close(maps.self_attn.sum(-1), torch.ones(2, 2, T), atol=1e-5, rtol=0)
    # layer 1's drawn weights mixed with the model's own V give the output of its fused attention
    layer = gen.model.decoder.layers[0]
    with torch.no_grad():
        h = layer.self_block.norm(gen.model.embed(torch.tensor([gen.tokenizer.encode(PROMPT)])))  # rotary adds nothing
        q, k, v = layer.self_attn.project_qkv(h)
        cos, sin = gen.model.rotary(torch.arange(T)[None])
        fused, _ = layer.self_attn.attend(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v,
                                          causal_mask(T, T), need_weights=False)
        drawn = (maps.self_attn[0][None] @ v).transpose(1, 2).reshape(1, T, -1)
        torch.testing.assert_close(layer.self_attn.out_proj(drawn), fused, atol=1e-5, rtol=0)


def test_png_has_every_layer_and_head(cli, trained_llama, tmp_path, maps):
    out = tmp_path / "att.png"
    r = cli("attention", "--model", trained_llama, PROMPT, "--out", out, "--layer", "1", "--head", "2")
    assert r.code == 0, r.err
    assert f"wrote {out}" in r.out
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    with Image.open(out) as im:
        im.verify()
    fig = draw_attention(maps, layer=0, head=1)
    try:
        found = {}

        def visit(f):
            for ax in f.axes:
                if "/" in ax.get_label():
                    found[ax.get_label()] = ax
            for sub in f.subfigs:
                visit(sub)

        visit(fig)
        assert set(found) == {f"self/L{i}/H{h}" for i in range(2) for h in range(2)} | {"self/focus"}
        shown = torch.as_tensor(found["self/focus"].images[0].get_array().data)
        assert torch.equal(shown, maps.self_attn[0, 1])
        assert [t.get_text() for t in found["self/focus"].get_yticklabels()] == maps.pieces
        assert f"prompt: {PROMPT}" in fig._suptitle.get_text()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["att.png"]


def test_html_holds_the_prompt_and_its_weights(cli, trained_lm, tmp_path):
    out = tmp_path / "att.html"
    r = cli("attention", "--model", trained_lm, PROMPT, "--out", out)
    assert r.code == 0, r.err
    page = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert data["heading"] == [["prompt", PROMPT]] and list(data["kinds"]) == ["self"]
    assert torch.tensor(data["kinds"]["self"]["weights"]).shape == (1, 2, len(PROMPT), len(PROMPT))  # 1 layer, 2 heads


def test_focus_ranks_the_heads_from_the_words_last_token(cli, trained_llama, maps):
    links = rank_heads(maps, "it", "cat", "sat")
    assert len(links) == 4
    it, cat, sat = len(PROMPT) - 1, [2, 3, 4], [6, 7, 8]  # "t" of "it"; the words without their spaces
    for h in links:
        w = maps.self_attn[h.layer - 1, h.head - 1, it]
        assert h.weight == pytest.approx(float(w[cat].sum()))
        assert h.contrast == pytest.approx(float(w[sat].sum()))
    r = cli("attention", "--model", trained_llama, PROMPT, "--focus", "it", "--to", "cat", "--vs", "sat")
    assert r.code == 0, r.err
    assert "self-attention heads ranked by attention from 'it' to 'cat'" in r.out
    assert f"about {1 / len(PROMPT):.3f} per piece" in r.out


@pytest.mark.parametrize("argv, mentions", [
    (["", "--out", "x.png"], ["empty"]),
    (["the cat sat on the mat and then", "--out", "x.png"], ["31 tokens", "context of 16"]),
    ([PROMPT, "--out", "x.png", "--kind", "cross"], ["--kind cross", "self"]),
    ([PROMPT, "--out", "x.png", "--head", "3"], ["--head 3"]),
    ([PROMPT, "--focus", "it", "--to", "giraffe"], ["giraffe"]),
    ([PROMPT, "--out", "x.png", "--target", "x"], ["--target"]),
])
def test_bad_input_one_line_error_no_file(cli, one_line_error, trained_lm, tmp_path, monkeypatch, argv, mentions):
    monkeypatch.chdir(tmp_path)
    one_line_error(cli("attention", "--model", trained_lm, *argv), "attention", *mentions)
    assert list(tmp_path.iterdir()) == []


def test_kind_self_on_a_translation_model(cli, one_line_error, tmp_path):
    from transformer import ModelConfig, Transformer
    from transformer.data.subwords import train_subwords
    from transformer.run import save_weights

    sw = train_subwords(["the animal is tired", "das tier ist müde"] * 20, tmp_path / "subwords", vocab_size=30)
    save_weights(Transformer(ModelConfig(vocab_size=sw.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1)),
                 tmp_path / "best.safetensors")
    r = cli("attention", "--model", tmp_path, "the animal", "--out", tmp_path / "a.png", "--kind", "self")
    one_line_error(r, "attention", "--kind self")


def test_a_pad_id_that_is_a_real_token_keeps_its_column(cli, tmp_path):
    """GPT-2 imported: its pad_id is a real token's ("!": GPT-2 has no spare id). The maps of a
    prompt holding it are HF's own attention weights (output_attentions), its key column
    included, in the maps and in the page ``transformer attention`` writes."""
    pytest.importorskip("transformers", reason="the checkpoint is built with transformers")
    folder, hf = build_checkpoint("gpt2", tmp_path / "hf")
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    prompt = "Hello world! the quick"
    gen = Generator.from_pretrained(tmp_path / "run", warn=False, precision="fp32")
    ids = gen.tokenizer.encode(prompt)
    pad_at = ids.index(gen.model.cfg.pad_id)
    assert pad_at < len(ids) - 1  # later tokens have it as a key
    hf.set_attn_implementation("eager")  # the implementation that returns its weights
    with torch.no_grad():
        theirs = torch.stack([w[0] for w in hf(torch.tensor([ids]), output_attentions=True).attentions])
    maps = collect_prompt_attention(gen.model, prompt, ids, [str(i) for i in ids])
    torch.testing.assert_close(maps.self_attn, theirs, atol=1e-5, rtol=0)
    assert float(maps.self_attn[:, :, pad_at + 1:, pad_at].min()) > 0  # no row drops the "!" column
    out = tmp_path / "att.html"
    r = cli("attention", "--model", tmp_path / "run", prompt, "--out", out)
    assert r.code == 0, r.err
    page = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    torch.testing.assert_close(torch.tensor(data["kinds"]["self"]["weights"]), theirs, atol=1e-4, rtol=0)
