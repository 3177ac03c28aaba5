"""Marian export through the command line: the saved Hugging Face directory translates
exactly as ours (token ids), greedy and beam 4; with its tokenizer files and the run's
decoding settings, text in gives `transformer translate`'s text out, with no other file.
HF's ``length_penalty`` divides by len ** p, ours by ((5 + len) / 6) ** alpha: both
searches rank by raw log-probability at 0, so the text comparisons use a run with alpha 0."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from transformer.data import Subwords, train_subwords  # noqa: E402
from transformer.decode import beam_search, greedy_search, pad_batch  # noqa: E402
from transformer.interop.marian_files import save_marian_tokenizer  # noqa: E402
from transformer.run import load_model  # noqa: E402

MAX_NEW = 60
TOKENIZER_FILES = {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json"}
# The run of the text comparisons: its own beam and a length limit HF can express exactly.
DECODING = {"beam": 3, "alpha": 0.0, "max_len_a": 0.0, "max_len_b": 40}
HAS_PIPELINE = int(transformers.__version__.split(".")[0]) < 5  # transformers 5 removed "translation"


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from transformer.cli import main

    out = tmp_path_factory.mktemp("marian") / "model"
    assert main(["export", "--model", str(trained.run), "--format", "marian", "--out", str(out)]) == 0
    return out


def test_directory_holds_weights_subwords_and_readme(exported, trained):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "generation_config.json", "subwords.model", "README.txt"} | TOKENIZER_FILES <= names
    for spm in ("source.spm", "target.spm"):  # the joint model serves both sides
        assert (exported / spm).read_bytes() == (trained.run / "subwords.model").read_bytes()
    assert any(n.endswith(".safetensors") for n in names)
    assert (exported / "subwords.model").read_bytes() == (trained.run / "subwords.model").read_bytes()
    assert "MarianMTModel.from_pretrained" in (exported / "README.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("beam", [1, 4])
def test_hf_generate_equals_ours(beam, exported, trained):
    model, _ = load_model(trained.run)
    cfg = model.cfg
    subwords = Subwords.load(exported / "subwords.model")
    hf = transformers.MarianMTModel.from_pretrained(exported, local_files_only=True).eval()
    src = pad_batch([subwords.encode(s) + [cfg.eos_id] for s in trained.sources(20)], cfg.pad_id)
    if beam == 1:
        ours = greedy_search(model, src, max_len_a=0.0, max_len_b=MAX_NEW)
    else:
        ours = beam_search(model, src, beam_size=beam, alpha=0.0, max_len_a=0.0, max_len_b=MAX_NEW)
    ours = [h[0].tokens for h in ours]
    assert all(len(o) < MAX_NEW for o in ours) and len({len(o) for o in ours}) >= 3
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam,
                          length_penalty=0.0, early_stopping=False, do_sample=False, max_new_tokens=MAX_NEW)
    theirs = []
    for row in out.tolist():
        row = row[1:]  # the decoder start token (BOS)
        theirs.append(row[: row.index(cfg.eos_id) + 1] if cfg.eos_id in row else row)
    assert theirs == ours


def _hf_translate(model_dir, lines: list[str], **generate) -> list[str]:
    """What transformers 4's translation pipeline did: MarianTokenizer, generate (with the
    directory's generation_config.json unless ``generate`` says otherwise), decode."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, **generate)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.fixture(scope="module")
def zero_alpha(trained, tmp_path_factory):
    """(run, export) for a copy of the trained run whose config.yaml says beam 3, alpha 0."""
    run = tmp_path_factory.mktemp("alpha0") / "run"
    run.mkdir()
    for name in ("best.safetensors", "subwords.model"):
        shutil.copyfile(trained.run / name, run / name)
    config = yaml.safe_load((trained.run / "config.yaml").read_text(encoding="utf-8"))
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "decoding": DECODING}), encoding="utf-8")
    out = run.parent / "marian"
    from transformer.cli import main

    assert main(["export", "--model", str(run), "--format", "marian", "--out", str(out)]) == 0
    return run, out


def _translate(cli, run, lines, tmp_path, *flags) -> list[str]:
    """`transformer translate`'s output lines, in fp32 (the exported model's arithmetic)."""
    src = tmp_path / "src.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    r = cli("translate", "--model", run, "--input", src, "--precision", "fp32", *flags)
    assert r.code == 0, r.err
    return r.out.splitlines()


def test_tokenizer_encodes_as_ours(exported):
    subwords = Subwords.load(exported / "subwords.model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert type(tokenizer).__name__ == "MarianTokenizer"
    for text in ["a man sits near the tree", "  two  spaces ", "</s> and <pad> typed in", "", "ĳ unseen ĳ"]:
        assert tokenizer(text).input_ids == subwords.encode(text) + [subwords.eos_id], text
    vocab = json.loads((exported / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == {subwords.id_to_piece(i): i for i in range(subwords.vocab_size)}
    config = json.loads((exported / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["source_lang"], config["target_lang"]) == ("en", "de")
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == \
        [subwords.pad_id, subwords.eos_id, subwords.unk_id]


def test_lowercasing_subword_model_lowercases_in_hf_too(tmp_path):
    """A ``lowercase: true`` run's normaliser is inside the .spm file MarianTokenizer loads."""
    texts = ["the red dog runs", "a small cat sits", "the big bird sees the ball"] * 20
    subwords = train_subwords(texts, tmp_path / "lc", vocab_size=40, lowercase=True)
    save_marian_tokenizer(subwords, tmp_path / "tok", model_max_length=64)
    tokenizer = transformers.MarianTokenizer.from_pretrained(tmp_path / "tok")
    for text in ["The RED Dog runs", "A Small CAT"]:
        ids = tokenizer(text).input_ids
        assert ids == subwords.encode(text) + [subwords.eos_id] == subwords.encode(text.lower()) + [subwords.eos_id]


def test_generation_config_carries_the_runs_decoding(exported, zero_alpha, trained):
    """The trained run's defaults (beam 4, alpha 0.6, max_len_a 1) and the alpha-0 copy's."""
    max_len = load_model(trained.run)[0].cfg.max_len
    default = json.loads((exported / "generation_config.json").read_text(encoding="utf-8"))
    assert (default["num_beams"], default["length_penalty"], default["early_stopping"]) == (4, 0.6, "never")
    assert default["max_length"] == max_len + 1  # max_len_a > 0: the model's limit, plus the start token
    assert default["bad_words_ids"] == [[0], [1]] and default["decoder_start_token_id"] == 1
    assert default["forced_eos_token_id"] == 2 and not default.get("_from_model_config")  # not rebuilt from config.json
    own = json.loads((zero_alpha[1] / "generation_config.json").read_text(encoding="utf-8"))
    assert (own["num_beams"], own["length_penalty"], own["max_length"]) == (3, 0.0, DECODING["max_len_b"] + 1)


def test_export_says_where_hf_can_differ(cli, trained, tmp_path):
    r = cli("export", "--model", trained.run, "--format", "marian", "--out", tmp_path / "m")
    assert r.code == 0, r.err
    assert "beam 4, alpha 0.6" in r.out and "len**0.6" in r.out and "max_len_a" in r.out


@pytest.mark.parametrize("beam", [None, 1], ids=["runs-beam", "greedy"])
def test_hf_text_in_text_out_equals_translate(beam, zero_alpha, trained, cli, tmp_path):
    """transformers 4: ``pipeline("translation", model=EXPORT_DIR)``; transformers 5, which has
    no translation pipeline: what it did (MarianTokenizer, generate, decode)."""
    run, out = zero_alpha
    lines = trained.sources(12)
    ours = _translate(cli, run, lines, tmp_path, *(["--beam", str(beam)] if beam else []))
    options = {"num_beams": beam} if beam else {}
    if HAS_PIPELINE:
        translate = transformers.pipeline("translation", model=str(out))
        theirs = [r["translation_text"] for r in translate(lines, **options)]
    else:
        theirs = _hf_translate(out, lines, **options)
    assert len(set(ours)) >= 10 and theirs == ours
