"""``transformer attention`` and the pictures behind it: the weights drawn are the model's."""
from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from PIL import Image

from transformer.errors import UserError
from transformer.inference.translator import load_translator
from transformer.viz.heatmap import DPI, draw_attention, save_png
from transformer.viz.html import render_html
from transformer.viz.maps import KINDS, collect_attention, find_word, prepare_pair, rank_heads, words

SENTENCE = "The animal didn't cross the street because it was too tired."
TARGET = "Das Tier überquerte die Straße nicht, weil es zu müde war."
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def translator(run_dir):
    return load_translator(run_dir, beam=1, precision="fp32")  # exact weights to check


@pytest.fixture(scope="module")
def maps(translator):
    pair = prepare_pair(translator, SENTENCE, TARGET)
    return collect_attention(translator.model, pair, translator.subwords.id_to_piece)


def heat_axes(fig) -> dict[str, object]:
    """{label: axes} of every heatmap in the figure (subfigures included)."""
    found = {}

    def visit(f):
        for ax in f.axes:
            if ax.get_label() and "/" in ax.get_label():
                found[ax.get_label()] = ax
        for sub in f.subfigs:
            visit(sub)

    visit(fig)
    return found


# ---- the weights ----------------------------------------------------------------------------

def test_shapes_and_labels(maps, translator):
    cfg = translator.model.cfg
    S, T = len(maps.src_pieces), len(maps.tgt_in_pieces)
    assert maps.encoder.shape == (cfg.n_layers, cfg.n_heads, S, S)
    assert maps.decoder.shape == (cfg.n_layers, cfg.n_heads, T, T)
    assert maps.cross.shape == (cfg.n_layers, cfg.n_heads, T, S)
    assert maps.src_pieces[-1] == "</s>" and maps.tgt_in_pieces[0] == "<s>" and maps.tgt_out_pieces[-1] == "</s>"
    assert maps.tgt_in_pieces[1:] == maps.tgt_out_pieces[:-1]
    assert translator.subwords.decode(translator.subwords.encode(TARGET)) == maps.translation


@pytest.mark.parametrize("kind", KINDS)
def test_rows_sum_to_one(maps, kind):
    w = maps.weights(kind)
    assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    assert (w >= 0).all()


def test_decoder_self_attention_drawn_has_nothing_above_the_diagonal(maps):
    fig = draw_attention(maps, kinds=("decoder",))
    try:
        axes = heat_axes(fig)
        drawn = [ax.images[0].get_array() for label, ax in axes.items() if label.startswith("decoder/")]
        assert len(drawn) == maps.n_layers * maps.n_heads + 1
        for a in drawn:
            m = torch.as_tensor(a.data if hasattr(a, "data") else a)
            assert m.shape[0] == m.shape[1] == len(maps.tgt_in_pieces)
            assert float(torch.triu(m, diagonal=1).abs().max()) == 0.0
            assert float(torch.diagonal(m).min()) > 0.0  # a position always sees itself
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_drawn_weights_reproduce_the_fused_attention_output(translator, maps):
    """Record every MultiHeadAttention.attend (self- and cross-attention both end there) in a
    run on the fused (no-weights) path and recompute its output from the weights we draw:
    out_proj(concat(weights @ V)) must match."""
    model = translator.model
    calls = []
    modules = [layer.self_attn for layer in model.encoder.layers]
    modules += [m for layer in model.decoder.layers for m in (layer.self_attn, layer.cross_attn)]

    def recording(mod):
        attend = mod.attend

        def wrapper(*args):  # (q, k, v, mask, need_weights), always passed by position
            out = attend(*args)
            calls.append((mod, args, out[0]))
            return out
        return wrapper

    for m in modules:
        m.attend = recording(m)
    pair = prepare_pair(translator, SENTENCE, TARGET)
    src = torch.tensor([pair.src_ids])
    tgt_in = torch.tensor([[model.cfg.bos_id, *pair.tgt_ids]])
    try:
        with torch.no_grad():
            memory = model.encode(src)  # return_weights=False: torch's fused kernel in fp32
            model.decode(tgt_in, model.start_cache(memory, src))
    finally:
        for m in modules:
            del m.attend
    L = model.cfg.n_layers
    drawn = [maps.encoder[i] for i in range(L)]
    drawn += [w for i in range(L) for w in (maps.decoder[i], maps.cross[i])]
    assert len(calls) == len(drawn) == 3 * L
    for (mod, args, out), w in zip(calls, drawn):
        assert args[4] is False  # need_weights: the fused path really ran
        v = args[2]  # (1, H, T_k, D)
        heads = w[None] @ v  # (1, H, T_q, D)
        concat = heads.transpose(1, 2).reshape(1, w.size(1), -1)
        torch.testing.assert_close(mod.out_proj(concat), out, atol=1e-5, rtol=0)


# ---- pictures -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["all", *KINDS])
def test_png_for_each_kind(cli, run_dir, tmp_path, kind, maps):
    out = tmp_path / f"{kind}.png"
    r = cli("attention", "--model", run_dir, SENTENCE, "--target", TARGET, "--out", out, "--kind", kind)
    assert r.code == 0, r.err
    assert f"wrote {out}" in r.out
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(out) as im:
        im.verify()
    kinds = KINDS if kind == "all" else (kind,)
    fig = draw_attention(maps, kinds=kinds)
    try:
        labels = set(heat_axes(fig))
        want = {f"{k}/L{i}/H{h}" for k in kinds for i in range(maps.n_layers) for h in range(maps.n_heads)}
        assert labels == want | {f"{k}/focus" for k in kinds}
        w_in, h_in = fig.get_size_inches()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    with Image.open(out) as im:
        assert im.size == (round(w_in * DPI), round(h_in * DPI))
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temporary file left


def test_enlarged_head_is_the_one_asked_for(maps):
    fig = draw_attention(maps, layer=0, head=1, kinds=("cross",))
    try:
        axes = heat_axes(fig)
        shown = torch.as_tensor(axes["cross/focus"].images[0].get_array().data)
        assert torch.equal(shown, maps.cross[0, 1])
        assert "layer 1, head 2" in axes["cross/focus"].get_title()
        rows = [t.get_text() for t in axes["cross/focus"].get_yticklabels()]
        assert rows == maps.tgt_out_pieces
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


@pytest.mark.parametrize("text", [
    "Große Männer grüßen schöne Frauen.",  # German umlauts, ß
    "Žluťoučký kůň úpěl ďábelské ódy.",  # Czech diacritics
    "你好，世界",  # CJK: drawn with an installed CJK font, or as □ when none is installed
])
def test_labels_render_without_missing_glyph_warnings(translator, text, tmp_path):
    pair = prepare_pair(translator, text, text)
    maps = collect_attention(translator.model, pair, translator.subwords.id_to_piece)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_png(draw_attention(maps, kinds=("cross",)), tmp_path / "x.png")
    glyphs = [str(w.message) for w in caught if "glyph" in str(w.message).lower()]
    assert glyphs == []
    assert (tmp_path / "x.png").read_bytes().startswith(PNG_SIGNATURE)


# ---- HTML -----------------------------------------------------------------------------------

def test_html_is_self_contained_and_holds_the_data(cli, run_dir, tmp_path, translator):
    out = tmp_path / "att.html"
    sentence = SENTENCE + " see http://example.com"
    maps = collect_attention(translator.model, prepare_pair(translator, sentence, TARGET),
                             translator.subwords.id_to_piece)
    r = cli("attention", "--model", run_dir, sentence, "--target", TARGET, "--out", out, "--html")
    assert r.code == 0, r.err
    page = out.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(link|img|iframe)\b|<script[^>]*\bsrc=", page)
    block = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1)
    data = json.loads(block)
    assert data["source"].endswith("see http://example.com")
    assert data["translation"] == TARGET
    enc = torch.tensor(data["kinds"]["encoder"]["weights"])
    assert enc.shape[:2] == (maps.n_layers, maps.n_heads)
    cross = torch.tensor(data["kinds"]["cross"]["weights"])
    torch.testing.assert_close(cross, maps.cross, atol=1e-4, rtol=0)
    assert data["kinds"]["cross"]["cols"] == maps.src_pieces


def test_html_escapes_script_end(maps):
    import dataclasses

    evil = dataclasses.replace(maps, source="</script><script>alert(1)</script>")
    page = render_html(evil)
    assert page.count("</script>") == 2  # the page's own two script blocks only


# ---- it -> animal ---------------------------------------------------------------------------

def test_words_group_pieces():
    pieces = ["▁The", "▁an", "im", "al", "▁it", "</s>"]
    assert words(pieces) == [("The", [0]), ("animal", [1, 2, 3]), ("it", [4]), ("</s>", [5])]
    assert find_word(pieces, "ANIMAL") == [1, 2, 3]
    with pytest.raises(UserError, match="not a word"):
        find_word(pieces, "street")


def test_rank_heads_ranks_every_head_by_it_to_animal(maps):
    links = rank_heads(maps, "it", "animal")
    assert len(links) == maps.n_layers * maps.n_heads
    assert [h.weight for h in links] == sorted((h.weight for h in links), reverse=True)
    rows, cols = find_word(maps.src_pieces, "it"), find_word(maps.src_pieces, "animal")
    top = links[0]
    expect = maps.encoder[top.layer - 1, top.head - 1][rows][:, cols].sum(-1).mean()
    assert top.weight == pytest.approx(float(expect))
    assert all(0.0 <= h.weight <= 1.0 + 1e-6 and h.top_weight >= h.weight - 1e-6 for h in links)


def test_focus_prints_a_ranked_table_without_a_picture(cli, run_dir, tmp_path):
    r = cli("attention", "--model", run_dir, SENTENCE, "--beam", "1", "--focus", "it", "--to", "animal")
    assert r.code == 0, r.err
    table = [line for line in r.out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s+[\d.]+", line)]
    assert len(table) == 4  # 2 layers x 2 heads
    assert "wrote" not in r.out
    r = cli("attention", "--model", run_dir, SENTENCE, "--beam", "1", "--focus", "it", "--to", "animal", "--vs", "street")
    assert r.code == 0, r.err
    assert "it->street" in r.out
    rows = [line.split() for line in r.out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+", line)]
    assert len(rows) == 4 and all(0.0 <= float(row[4]) <= 1.0 for row in rows)


def test_rank_heads_contrast(maps):
    links = rank_heads(maps, "it", "animal", "street")
    cols = find_word(maps.src_pieces, "street")
    rows = find_word(maps.src_pieces, "it")
    for h in links:
        assert h.contrast == pytest.approx(float(maps.encoder[h.layer - 1, h.head - 1][rows][:, cols].sum(-1).mean()))


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, mention", [
    (["--layer", "3"], "--layer 3"),
    (["--layer", "0"], "--layer 0"),
    (["--head", "5"], "--head 5"),
    (["--focus", "it"], "--to"),
    (["--focus", "it", "--to", "giraffe"], "giraffe"),
    (["--vs", "street"], "--vs"),
])
def test_bad_options_one_line_error_no_file(cli, one_line_error, run_dir, tmp_path, extra, mention):
    out = tmp_path / "a.png"
    r = cli("attention", "--model", run_dir, SENTENCE, "--beam", "1", "--out", out, *extra)
    one_line_error(r, "attention", mention)
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("name", ["a.svg", "a.pdf"])
def test_a_picture_name_that_is_not_png_is_refused(cli, one_line_error, run_dir, tmp_path, name):
    """The picture is always a PNG: an --out named .svg or .pdf would hold PNG bytes."""
    r = cli("attention", "--model", run_dir, SENTENCE, "--beam", "1", "--out", tmp_path / name)
    one_line_error(r, "attention", name)
    assert list(tmp_path.iterdir()) == []

def test_missing_model_and_empty_sentence(cli, one_line_error, run_dir, tmp_path):
    out = tmp_path / "a.png"
    r = cli("attention", "--model", tmp_path / "nope", SENTENCE, "--out", out)
    one_line_error(r, "attention", "nope")
    for empty in ["", "   "]:
        r = cli("attention", "--model", run_dir, empty, "--out", out)
        one_line_error(r, "attention", "empty")
    r = cli("attention", "--model", run_dir, SENTENCE)
    one_line_error(r, "attention", "--out")
    assert list(tmp_path.iterdir()) == []


def test_font_fallback_picks_a_font_per_script(monkeypatch):
    """With a CJK font installed it joins the fallback list; a character no font has is
    drawn as a box (no warning either way)."""
    from transformer.viz import fonts

    fake = {"DejaVu Sans": frozenset(map(ord, "abcä□$")), "Some CJK Sans": frozenset(map(ord, "你好"))}
    monkeypatch.setattr(fonts, "_charmaps", lambda: fake)
    assert fonts.families(["aä", "你好"]) == ["DejaVu Sans", "Some CJK Sans"]
    assert fonts.families(["abc"]) == ["DejaVu Sans"]
    assert fonts.displayable("a你z$") == "a你□\\$"
