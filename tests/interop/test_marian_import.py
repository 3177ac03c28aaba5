"""A Hugging Face Marian folder imported as a translation run (interop/marian_run.py) with
its own tokenizer (data/marian_tokenizer.py): the same ids as ``MarianTokenizer``, the same
logits as ``MarianMTModel``, the same translations as ``generate`` + ``batch_decode``.

Each folder is built here, with no network: two sentencepiece models trained on a tiny
corpus, Marian's vocab.json (``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last), a
``MarianTokenizer`` saved from them, and a small random ``MarianMTModel`` saved beside it;
once with one vocabulary for both sides (shared embeddings), once with separate ones.

A random model rarely says EOS, or says it at once. So that translations end by
themselves at varied lengths, before the length limit (where HF's forced EOS scores 0 and
ours keeps its log-probability), the decoder carries its position to the output untouched
in one dimension (a cosine that falls with the position), and EOS's output row reads it:
EOS grows likelier with every step, and when it wins depends on the sentence.
"""
from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import yaml
from hf_checkpoints import randomize_marian
from safetensors.torch import load_file
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

from transformer.data.marian_tokenizer import MarianSubwords
from transformer.errors import UserError
from transformer.interop.marian_run import decoding_from_generation, generation_differences, import_marian_run
from transformer.run import load_model
from transformer.inference.translator import Translator

SRC = ["A dog runs across the field.", "Two children play in the snow!", "The café serves crème brûlée.",
       "A man reads a newspaper on the train.", "She sings a song, he plays guitar.", "Über den Fluss fährt ein Boot.",
       "Where is the station?", "I love sushi 🍣 and tea 🍵.", "It's 5 o'clock, isn't it?", "The quick brown fox jumps."]
TGT = ["Ein Hund rennt über das Feld.", "Zwei Kinder spielen im Schnee!", "Das Café serviert Crème brûlée.",
       "Ein Mann liest im Zug eine Zeitung.", "Sie singt ein Lied, er spielt Gitarre.", "日本語の文章です。",
       "Wo ist der Bahnhof?", "Ich liebe Sushi 🍣 und Tee 🍵.", "Es ist 5 Uhr, nicht wahr?", "Der schnelle braune Fuchs."]
# spaces (leading, repeated, trailing), accents, CJK, emoji, characters never seen (unknown),
# a language code, special tokens written in the text
TEXTS = ["A dog runs across the field.", "  Two  children,   café  ", "日本語 🍣 Crème brûlée", "ÄÖÜ ß unseen ✓ 𝔘",
         ">>de<< A dog", "a </s> b <unk> c", "x<pad>y", "Where is the station?", "It's 5 o'clock.", "", " "]
SENTENCES = ["A dog runs across the field.", "Two children play in the snow!", "The café serves crème brûlée.",
             "日本語 🍣 Crème", "Where is the station?", "It's 5 o'clock.", "She sings a song, he plays guitar."]
D_MODEL, MAX_LENGTH, POS_DIM = 32, 30, 20  # POS_DIM: cos(0.1 * position) in our [sin | cos] table
QUIET = 0.2  # the decoder's sub-layer outputs are scaled by this
EOS_BIAS = {True: 17.0, False: 2.0}  # by shared vocabulary: EOS's logit bias, found by trying


def _spm(texts: list[str], prefix: Path) -> spm.SentencePieceProcessor:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts * 3), model_prefix=str(prefix), vocab_size=70,
                                   character_coverage=1.0, minloglevel=2, num_threads=1)
    return spm.SentencePieceProcessor(model_file=f"{prefix}.model")


def _vocab(*models: spm.SentencePieceProcessor) -> dict[str, int]:
    vocab = {"</s>": 0, "<unk>": 1}
    for sp in models:
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


@torch.no_grad()
def _model(src_vocab: int, tgt_vocab: int, pad: int, shared: bool, eos_bias: float | None = None) -> MarianMTModel:
    hf = MarianMTModel(MarianConfig(
        vocab_size=src_vocab, decoder_vocab_size=tgt_vocab, share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=shared, d_model=D_MODEL, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        activation_function="swish", scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=0)).eval()
    randomize_marian(hf, seed=0, std=0.3)
    # EOS reads the position (module docstring): no embedding and no sub-layer writes POS_DIM,
    # the sub-layers are quiet enough for the residual stream to carry it through the norms
    hf.model.decoder.embed_tokens.weight[:, POS_DIM] = 0
    for layer in hf.model.decoder.layers:
        for proj in (layer.self_attn.out_proj, layer.encoder_attn.out_proj, layer.fc2):
            proj.weight.mul_(QUIET)
            proj.weight[POS_DIM], proj.bias[POS_DIM] = 0, 0
    hf.lm_head.weight[:, POS_DIM] = 0
    hf.lm_head.weight[0] = 0
    hf.lm_head.weight[0, POS_DIM] = -40.0
    hf.final_logits_bias[0, 0] = EOS_BIAS[shared] if eos_bias is None else eos_bias
    return hf


def build_marian(folder: Path, shared: bool, eos_bias: float | None = None) -> Path:
    """A Marian folder as the OPUS-MT conversions have it (module docstring); ``eos_bias``
    replaces EOS's logit bias (-1e4: a model that never ends a translation itself)."""
    work = folder / "work"
    work.mkdir(parents=True)
    source, target = _spm(SRC, work / "source"), _spm(TGT, work / "target")
    src_vocab = _vocab(source, target) if shared else _vocab(source)
    tgt_vocab = src_vocab if shared else _vocab(target)
    (work / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False), encoding="utf-8")
    extra = {}
    if not shared:
        (work / "target_vocab.json").write_text(json.dumps(tgt_vocab, ensure_ascii=False), encoding="utf-8")
        extra = dict(separate_vocabs=True, target_vocab_file=str(work / "target_vocab.json"))
    assert src_vocab["<pad>"] == tgt_vocab["<pad>"], "the model has one pad id"
    out = folder / "opus-mt-en-de"
    MarianTokenizer(str(work / "source.model"), str(work / "target.model"), str(work / "vocab.json"),
                    source_lang="en", target_lang="de", **extra).save_pretrained(out)
    hf = _model(len(src_vocab), len(tgt_vocab), src_vocab["<pad>"], shared, eos_bias)
    # as OPUS-MT ships it, with length_penalty 0 (see test_length_penalty_maps_to_alpha)
    hf.generation_config.update(num_beams=4, max_length=MAX_LENGTH, bad_words_ids=[[src_vocab["<pad>"]]],
                                length_penalty=0.0)
    hf.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["shared", "separate"])
def marian(request, tmp_path_factory):
    """(HF folder, MarianMTModel, MarianTokenizer, our imported run)."""
    base = tmp_path_factory.mktemp(f"marian-{request.param}")
    folder = build_marian(base, shared=request.param == "shared")
    run = base / "run"
    import_marian_run(folder, run)
    return folder, MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder), run


# ---- the run ------------------------------------------------------------------------------------
def test_run_holds_weights_tokenizer_and_decoding(marian):
    folder, hf, _, run = marian
    separate = (folder / "target_vocab.json").is_file()
    names = {p.name for p in run.iterdir()}
    assert {"best.safetensors", "config.yaml", "import.json", "source.spm", "target.spm", "vocab.json",
            "tokenizer_config.json"} <= names
    assert ("target_vocab.json" in names) == separate
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert (config["src_lang"], config["tgt_lang"]) == ("en", "de")
    assert config["decoding"] == {"beam": 4, "alpha": 0.0, "length_norm": "length", "max_len_a": 0.0,
                                  "max_len_b": MAX_LENGTH - 1}
    model, _ = load_model(run)
    c = model.cfg
    assert config["model"] == c.to_dict()
    pad = hf.config.pad_token_id
    assert (c.pad_id, c.bos_id, c.eos_id) == (pad, pad, 0)  # decoding starts from <pad>
    assert c.tie_embeddings != separate and c.ffn_activation == "silu" and c.output_bias
    assert (c.vocab_size, c.target_vocab_size) == (hf.config.vocab_size, hf.config.decoder_vocab_size)


def test_positions_are_marians_sin_then_cos(marian):
    """Marian's table: sin(pos * w_i) in the first half, cos(pos * w_i) in the second."""
    _, hf, _, run = marian
    model, _ = load_model(run)
    ours = model.positions.pe.float()[: hf.config.max_position_embeddings]
    pos = torch.arange(ours.size(0), dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, D_MODEL, 2, dtype=torch.float64) / D_MODEL)
    assert (ours - torch.cat([torch.sin(pos * w), torch.cos(pos * w)], dim=1)).abs().max() < 1e-6
    assert torch.equal(ours, hf.model.decoder.embed_positions.weight.float())


def test_logits_equal_hf(marian):
    _, hf, tok, run = marian
    model, _ = load_model(run)
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    g = torch.Generator().manual_seed(3)
    tgt = torch.randint(2, hf.config.decoder_vocab_size - 1, (len(SENTENCES), 9), generator=g)
    tgt[:, 0] = hf.config.decoder_start_token_id
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=tgt).logits
        ours = model(batch["input_ids"], tgt)
    assert (ours - theirs).abs().max().item() <= 1e-5


# ---- the tokenizer ------------------------------------------------------------------------------
def test_tokenizer_equals_marian_tokenizer(marian):
    folder, _, tok, run = marian
    ours = MarianSubwords.load(run)
    assert ours.vocab_size == len(json.loads((folder / ("target_vocab.json" if ours.separate else "vocab.json"))
                                             .read_text(encoding="utf-8")))
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ours.encode(text) + [ours.eos_id] == ids, text
        target = tok(text_target=text)["input_ids"]
        assert ours.encode_target(text) + [ours.eos_id] == target, text
        for seq in (ids, target):
            assert ours.decode(seq) == tok.decode(seq, skip_special_tokens=True), seq
    assert ours.decode(tok(text_target="Ich liebe Sushi 🍣 und Tee 🍵.")["input_ids"]) == "Ich liebe Sushi 🍣 und Tee 🍵."
    src_pieces = {i: p for p, i in json.loads((folder / "vocab.json").read_text(encoding="utf-8")).items()}
    src_ids = tok(TEXTS[2])["input_ids"]
    assert [ours.source_piece(i) for i in src_ids] == [src_pieces[i] for i in src_ids]
    rng = random.Random(0)
    for _ in range(200):  # any ids, specials and unknowns among them
        seq = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 15))]
        assert ours.decode(seq) == tok.decode(seq, skip_special_tokens=True), seq


# ---- translation --------------------------------------------------------------------------------
def _generate(hf, tok, **options) -> tuple[list[str], list[list[int]]]:
    batch = tok(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, **options)
    tokens = []
    for row in out[:, 1:].tolist():  # without the start token, up to EOS
        tokens.append(row[: row.index(0)] if 0 in row else row)
    return tok.batch_decode(out, skip_special_tokens=True), tokens


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_hf_generate(marian, beam):
    """Translator (the run's decoding settings) = generate (the generation config) + batch_decode."""
    _, hf, tok, run = marian
    translator = Translator.from_pretrained(run, beam=beam, precision="fp32", compile="off")
    assert isinstance(translator.subwords, MarianSubwords)
    texts, tokens = _generate(hf, tok, num_beams=beam)
    ours = translator.translate_nbest(SENTENCES, 1)
    assert [r[0].tokens for r in ours] == tokens
    assert [r[0].text for r in ours] == texts
    lengths = [len(t) for t in tokens]
    assert max(lengths) < MAX_LENGTH - 1 and len(set(lengths)) >= 2, f"want varied natural endings, got {lengths}"
    assert len(set(texts)) >= 3, texts


def test_beam_nbest_equals_hf_return_sequences(marian):
    _, hf, tok, run = marian
    translator = Translator.from_pretrained(run, n_best=4, precision="fp32", compile="off")
    _, tokens = _generate(hf, tok, num_return_sequences=4)
    ours = [h.tokens for r in translator.translate_nbest(SENTENCES) for h in r]
    assert ours == tokens
    assert max(len(t) for t in tokens) < MAX_LENGTH - 1


@pytest.mark.parametrize("penalty", [0.3, 0.6])
def test_beam_search_with_hfs_length_penalty_equals_hf(marian, penalty):
    """length_norm "length" divides by len ** alpha as HF's length_penalty does: with HF's
    exact stopping bound (early_stopping="never") the two beam searches agree, n-best included."""
    _, hf, tok, run = marian
    # room for every hypothesis to end with EOS (at the length limit the two end differently:
    # ours with a forced EOS, HF's with its last token)
    longest = 63
    translator = Translator.from_pretrained(run, n_best=4, alpha=penalty, max_len_b=longest, precision="fp32",
                                            compile="off")
    assert translator.decoding.length_norm == "length"
    _, tokens = _generate(hf, tok, num_return_sequences=4, length_penalty=penalty, early_stopping="never",
                          max_length=longest + 1)
    ours = [h.tokens for r in translator.translate_nbest(SENTENCES) for h in r]
    assert ours == tokens and max(map(len, tokens)) < longest


def test_length_penalty_maps_to_alpha():
    """HF's defaults (generate's when the generation config leaves a setting unset), and the
    length limit: max_length counts the start token, and the model's max_len caps it; ours
    counts the EOS it forces at the limit, which HF writes only with forced_eos_token_id."""
    assert decoding_from_generation(GenerationConfig(), 512, 0) == \
        {"beam": 1, "alpha": 1.0, "length_norm": "length", "max_len_a": 0.0, "max_len_b": 21}
    opus = GenerationConfig(num_beams=6, max_length=512, length_penalty=0.6, forced_eos_token_id=0)
    assert decoding_from_generation(opus, 64, 0) == {"beam": 6, "alpha": 0.6, "length_norm": "length",
                                                     "max_len_a": 0.0, "max_len_b": 64}
    assert decoding_from_generation(GenerationConfig(max_new_tokens=40), 512, 0)["max_len_b"] == 41
    forced = GenerationConfig(max_new_tokens=40, forced_eos_token_id=0)
    assert decoding_from_generation(forced, 512, 0)["max_len_b"] == 40
    assert decoding_from_generation(GenerationConfig(max_length=20, forced_eos_token_id=[0]), 512, 0)["max_len_b"] == 19
    assert decoding_from_generation(GenerationConfig(forced_eos_token_id=0), 16, 0)["max_len_b"] == 15  # 20 new, capped


@pytest.fixture(scope="module")
def endless(tmp_path_factory) -> Path:
    """An OPUS-MT-style folder (separate vocabularies) whose model never says EOS: every
    translation runs to the length limit."""
    return build_marian(tmp_path_factory.mktemp("marian-endless"), shared=False, eos_bias=-1e4)


@pytest.mark.parametrize("forced", [True, False], ids=["forced-eos", "no-forced-eos"])
@pytest.mark.parametrize("limit", [{}, {"max_length": 20}, {"max_new_tokens": 12}, {"max_length": 64}],
                         ids=["unset", "max_length-20", "max_new_tokens-12", "max_length-64"])
def test_a_translation_that_runs_to_the_limit_is_as_long_as_hfs(endless, tmp_path, forced, limit):
    """generate's limit counts the start token (max_length), or is 20 new tokens when unset,
    and ends with EOS only where forced_eos_token_id asks; the import maps each to the limit at
    which ours has HF's tokens (greedy) and HF's length (beam 4: at the limit the two score EOS
    differently, so they may pick other tokens, docs/import.md)."""
    folder = tmp_path / "folder"
    shutil.copytree(endless, folder)
    for name in ("generation_config.json", "config.json"):
        settings = json.loads((folder / name).read_text(encoding="utf-8"))
        settings.pop("max_length", None)
        if not forced:
            settings.pop("forced_eos_token_id", None)
        (folder / name).write_text(json.dumps({**settings, **(limit if name != "config.json" else {})}),
                                   encoding="utf-8")
    import_marian_run(folder, tmp_path / "run")
    hf, tok = MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(folder)
    assert hf.generation_config.forced_eos_token_id == (0 if forced else None)
    new = limit.get("max_new_tokens") or limit.get("max_length", 21) - 1  # generate's most new tokens
    for beam in (1, 4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generate's advice to set max_new_tokens when max_length is unset
            _, tokens = _generate(hf, tok, num_beams=beam)
        ours = [r[0].tokens for r in Translator.from_pretrained(tmp_path / "run", beam=beam, precision="fp32",
                                                                 compile="off").translate_nbest(SENTENCES, 1)]
        assert [len(t) for t in tokens] == [new - forced] * len(SENTENCES)  # no EOS of its own: all at the limit
        assert [len(t) for t in ours] == [len(t) for t in tokens], beam
        if beam == 1:
            assert ours == tokens


def test_generation_settings_not_followed_are_listed(marian):
    folder, _, _, run = marian
    assert json.loads((run / "import.json").read_text(encoding="utf-8"))["decoding_differences"] == []
    opus = GenerationConfig(num_beams=4, bad_words_ids=[[96]], renormalize_logits=True, no_repeat_ngram_size=3)
    found = generation_differences(opus, pad_id=96)
    assert [f.split(":")[0].split("=")[0] for f in found] == ["early_stopping", "renormalize_logits",
                                                               "no_repeat_ngram_size"]
    assert generation_differences(GenerationConfig(num_beams=4, length_penalty=0.0, bad_words_ids=[[96]]), 96) == []


def test_pytorch_model_bin_is_read_as_tensors_only(marian, tmp_path):
    """A checkpoint as pytorch_model.bin gives the same model; one whose pickle would run code
    is refused without running it."""
    folder, hf, tok, run = marian
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    torch.save(load_file(old / "model.safetensors"), old / "pytorch_model.bin")
    (old / "model.safetensors").unlink()
    import_marian_run(old, tmp_path / "run")
    a, _ = load_model(run)
    b, _ = load_model(tmp_path / "run")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    marker = tmp_path / "ran"

    class Code:
        def __reduce__(self):
            return open, (str(marker), "w")

    torch.save({"final_logits_bias": Code()}, old / "pytorch_model.bin")
    with pytest.raises(UserError, match="refused"):
        import_marian_run(old, tmp_path / "run2")
    assert not marker.exists() and not (tmp_path / "run2").exists()


# ---- bad input ----------------------------------------------------------------------------------
def test_missing_source_spm_is_one_line(marian, tmp_path):
    folder = marian[0]
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "source.spm").unlink()
    with pytest.raises(UserError, match="no source.spm") as e:
        import_marian_run(broken, tmp_path / "run")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


# ---- the commands -------------------------------------------------------------------------------
def test_commands_on_an_imported_run(marian, tmp_path, capsys, monkeypatch):
    """``transformer import`` on the folder, then translate, evaluate, info, attention and
    explain on the run it wrote, in-process."""
    from transformer.cli import main

    folder, hf, tok, _ = marian
    run = tmp_path / "run"
    assert main(["import", str(folder), "--out", str(run)]) == 0
    assert "marian" in capsys.readouterr().out
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    texts, _ = _generate(hf, tok, num_beams=4)
    ref.write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("".join(s + "\n" for s in SENTENCES)))
    assert main(["translate", "--model", str(run), "--precision", "fp32", "--compile", "off"]) == 0
    assert capsys.readouterr().out.splitlines() == texts
    # the references are HF's own translations: a perfect chrF (BLEU needs 4-grams these lack)
    assert main(["evaluate", "--model", str(run), "--src", str(src), "--ref", str(ref), "--json",
                 "--precision", "fp32", "--compile", "off"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["chrf"] == pytest.approx(100.0) and scores["n_sentences"] == len(SENTENCES)
    assert main(["info", "--model", str(run)]) == 0
    assert "encoder-decoder translation model" in capsys.readouterr().out
    assert main(["attention", "--model", str(run), "--out", str(tmp_path / "a.png"), SENTENCES[0]]) == 0
    assert (tmp_path / "a.png").stat().st_size > 0
    assert f"translation: {texts[0]}\n" in capsys.readouterr().out
    assert main(["explain", "--model", str(run), "--step", "1", SENTENCES[0]]) == 0
    out = capsys.readouterr().out
    assert f"translation: {texts[0]}\n" in out and "(bit-identical)" in out
    if not MarianSubwords.load(run).separate:  # with two vocabularies the labels read source ids as target ones
        assert "source pieces: " + " ".join(MarianSubwords.load(run).pieces(SENTENCES[0])) + " </s>\n" in out



@pytest.mark.parametrize("format", ["marian", "ctranslate2"])
def test_export_of_an_imported_run_says_why_it_is_refused(marian, format, tmp_path, capsys):
    """An imported Marian run has no subwords.model: export refuses it in one line that says
    so (it asked for the run directory it was given)."""
    from transformer.cli import main

    run = marian[3]
    assert main(["export", "--model", str(run), "--format", format, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an imported Marian model" in err and "give the run directory" not in err
    assert not (tmp_path / "out").exists()


def test_evaluate_split_on_an_imported_run_says_it_has_no_dataset(marian, capsys):
    from transformer.cli import main

    assert main(["evaluate", "--model", str(marian[3]), "--split", "test_2016_flickr"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config names no dataset" in err and "None" not in err

def test_served(marian):
    """``transformer serve``'s app on the imported run: /translate gives HF's translations."""
    pytest.importorskip("fastapi", reason="transformer serve needs the serve extra")
    from starlette.testclient import TestClient

    from transformer.serve import ServeConfig, create_app

    _, hf, tok, run = marian
    texts, _ = _generate(hf, tok, num_beams=4)
    translator = Translator.from_pretrained(run, precision="fp32", compile="off")
    with TestClient(create_app(translator, ServeConfig(), model_name="opus-mt")) as client:
        reply = client.post("/translate", json={"texts": SENTENCES})
        assert reply.status_code == 200, reply.text
        assert reply.json()["translations"] == texts
        maps = client.post("/attention", json={"text": SENTENCES[0]})
        assert maps.status_code == 200, maps.text


def test_a_vocabulary_with_a_missing_id_decodes_as_hf(marian, tmp_path):
    """An id that vocab.json lacks is read from the sentencepiece model, and its piece encodes
    as <unk>, as MarianTokenizer does."""
    folder, hf, tok, _ = marian
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    name = "target_vocab.json" if (folder / "target_vocab.json").is_file() else "vocab.json"
    vocab = json.loads((short / name).read_text(encoding="utf-8"))
    last = 30  # a piece in the middle
    vocab = {p: i for p, i in vocab.items() if i != last}
    (short / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    import_marian_run(short, tmp_path / "run")
    translator = Translator.from_pretrained(tmp_path / "run", precision="fp32", compile="off")
    theirs = MarianTokenizer.from_pretrained(short)
    assert translator.translate(SENTENCES) == _generate(hf, theirs)[0]
    ids = list(range(40))  # ids both sentencepiece models have
    assert translator.subwords.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
