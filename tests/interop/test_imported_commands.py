"""Every command on a run imported from a tiny Hugging Face checkpoint (built in the test):
the service stops at the model's EOS and draws its attention, ``info`` names every weight,
the exports write what they can express and refuse the rest in one line, and GPT-2's padding
id (a real token there) is read as text."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from hf_checkpoints import PROMPT, TEXT, build_checkpoint
from transformer.cli import main
from transformer.inference.generator import Generator
from transformer.run import load_model

pytest.importorskip("transformers")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """family -> (HF folder, HF model, run directory), each imported once, when first asked for."""
    made: dict[str, tuple[Path, torch.nn.Module, Path]] = {}

    def get(family: str):
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            folder, hf = build_checkpoint(family, root / "hf")
            assert main(["import", str(folder), "--out", str(root / "run")]) == 0
            made[family] = folder, hf, root / "run"
        return made[family]
    return get


def greedy(run: Path, n: int = 12, **options) -> Generator:
    return Generator.from_pretrained(run, warn=False, precision="fp32", temperature=0.0, max_new_tokens=n,
                                     **{"compile": "off", **options})


# ---- serve ----------------------------------------------------------------------------------

def _client(run: Path):
    from starlette.testclient import TestClient

    from transformer.serve import ServeConfig, create_app

    return TestClient(create_app(greedy(run), ServeConfig(), model_name="imported"))


def _events(body: str) -> list[tuple[str, dict]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = block.split("\n")
        event = lines[0].removeprefix("event: ") if lines[0].startswith("event: ") else "message"
        out.append((event, json.loads(lines[-1].removeprefix("data: "))))
    return out


def test_service_stops_at_the_models_eos(runs, tmp_path):
    """A stop id of import.json (here: the first token of the free greedy run
    that is not its first) ends the served
    continuation there, in JSON and streamed, as ``transformer generate`` ends it."""
    _, _, imported = runs("llama3")
    free = greedy(imported)
    ids = free.encode(PROMPT)
    with torch.no_grad():
        from transformer.decode.sample import generate_stream

        produced = [int(t) for t in generate_stream(free.model, [ids], 12, 0.0)]
    end = next(k for k in range(1, len(produced) - 1) if produced[k] not in produced[:k]) + 1
    stop = produced[end - 1]  # the first new token after the first
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    record = json.loads((run / "import.json").read_text())
    never = next(i for i in range(free.model.cfg.vocab_size) if i not in produced)
    (run / "import.json").write_text(json.dumps({**record, "stop_ids": [stop, never]}))
    expected = greedy(run).generate([PROMPT])[0]
    assert expected == free.tokenizer.decode(produced[:end])

    with _client(run) as client:
        answer = client.post("/generate", json={"prompt": PROMPT}).json()
        assert (answer["text"], answer["tokens"]) == (expected, end)
        streamed = _events(client.post("/generate", json={"prompt": PROMPT, "stream": True}).text)
    pieces = [data for event, data in streamed if event == "message"]
    assert [p["token"] for p in pieces if p["token"] is not None] == produced[:end]
    assert "".join(p["text"] for p in pieces) == expected
    assert streamed[-1][0] == "done" and streamed[-1][1]["text"] == expected


def test_serve_names_the_runs_own_max_new_tokens(tmp_path, capsys):
    """An imported model's generation_config.json max_new_tokens (2048) above serve's default
    limit (1024): the line named --max-new-tokens 2048, an option nobody gave."""
    folder, _ = build_checkpoint("gpt2", tmp_path / "hf")
    (folder / "generation_config.json").write_text(json.dumps({"max_new_tokens": 2048}))
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["serve", "--model", str(tmp_path / "run"), "--port", "0"]) == 2
    assert capsys.readouterr().err == ("transformer serve: error: the run's default max_new_tokens (2048) is larger "
                                       "than --new-tokens-limit 1024; give --max-new-tokens N, or a larger "
                                       "--new-tokens-limit\n")


def test_explorer_and_attention_on_an_imported_run(runs):
    _, _, run = runs("llama3")
    with _client(run) as client:
        page = client.get("/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert client.get("/static/explorer.js").status_code == 200
        maps = client.post("/attention", json={"text": PROMPT}).json()
        health = client.get("/health").json()
    n = len(maps["tokens"])
    assert n == len(greedy(run).encode(PROMPT))
    assert (maps["n_layers"], maps["n_heads"]) == (2, 4) and health["vocab_size"] == load_model(run)[0].cfg.vocab_size
    rows = torch.tensor(maps["self_attention"])  # (L, H, T, T), causal, each row sums to 1
    assert rows.shape == (2, 4, n, n)
    assert torch.allclose(rows.sum(-1), torch.ones(2, 4, n), atol=1e-2)
    assert not rows.triu(1).any()


@pytest.mark.parametrize("family", ["gpt2", "llama2-sp"])
def test_attention_focus_finds_the_words_of_an_imported_tokenizer(runs, family, capsys):
    """--focus / --to find a word that a byte-level token (" world") or a sentencepiece piece
    ("\u2581world") starts, as they find a character model's words."""
    _, _, run = runs(family)
    assert main(["attention", "--model", str(run), "Hello world", "--focus", "world", "--to", "Hello"]) == 0
    assert "ranked by attention from 'world' to 'Hello'" in capsys.readouterr().out


@pytest.mark.parametrize("family, first", [("gpt2", "H"), ("llama3", "<|begin_of_text|>"), ("llama2-sp", "<s>")])
def test_explain_shows_special_tokens_by_name_and_split_characters_by_their_bytes(runs, family, first, capsys):
    """An imported tokenizer's special token was shown as our <s> / <pad> (Llama 3's
    <|begin_of_text|> as <s>, GPT-2's <|endoftext|> as <pad>), and each byte-level token of
    a split emoji as U+FFFD: now by its own name, and by its bytes, which join to the emoji's."""
    _, _, run = runs(family)
    capsys.readouterr()
    assert main(["explain", "--model", str(run), "Hi 🙂 ok<|endoftext|>", "--step", "1", "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["tokens"]
    assert tokens[0] == first and "\ufffd" not in "".join(tokens)
    if family == "gpt2":
        assert tokens[-1] == "<|endoftext|>"
    if family != "llama2-sp":  # byte-level BPE: the emoji is split into byte tokens
        shown = "".join(tokens)
        emoji = "".join(f"<0x{b:02X}>" for b in "🙂".encode())
        assert "▁" + emoji in shown and "<0x" not in shown.replace(emoji, "")


def test_explain_prints_no_control_character(runs, capsys):
    """Byte-level BPE has a token for each control byte: ESC went raw to the terminal (and
    drove it), a carriage return overwrote the line. Shown as <0x1B> and \\r; a Qwen2 id
    beyond its tokenizer (the padded embedding) as <unused_N>, not '?'."""
    from transformer.data.text import load_tokenizer
    from transformer.viz.walkthrough_lm import token_shower

    _, _, run = runs("gpt2")
    capsys.readouterr()
    assert main(["explain", "--model", str(run), "a\x1b[31mred\rb", "--step", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    tokens = next(line for line in out.splitlines() if line.strip().startswith("tokens:"))
    assert "<0x1B>" in tokens and "\\r" in tokens
    tokenizer = load_tokenizer(runs("qwen2")[2])
    assert token_shower(tokenizer)(tokenizer.vocab_size + 1) == f"<unused_{tokenizer.vocab_size + 1}>"


def test_service_attention_names_special_tokens_and_bytes(runs):
    """The explorer's attention map labelled Llama 3's BOS as an empty cell and each byte of a
    split emoji as U+FFFD."""
    _, _, run = runs("llama3")
    with _client(run) as client:
        tokens = client.post("/attention", json={"text": "Hi 🙂"}).json()["tokens"]
    assert tokens == ["<|begin_of_text|>", "H", "i", " <0xF0><0x9F>", "<0x99>", "<0x82>"]


def test_a_text_of_one_token_is_one_line_naming_the_file(runs, tmp_path, capsys):
    """GPT-2 adds no BOS: one character is one token, nothing to predict; Llama 3's BOS
    gives it something to predict from."""
    text = tmp_path / "one.txt"
    text.write_text("a", encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", "--model", str(runs("gpt2")[2]), "--text", str(text)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"transformer evaluate: error: {text}: a text of 1 token(s) "
                                                    "has nothing to score"), err
    assert main(["evaluate", "--model", str(runs("llama3")[2]), "--text", str(text), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["tokens"] == 1


@pytest.mark.parametrize("extra", [[], ["--html"]])
def test_attention_out_empty_is_one_line(runs, extra, tmp_path, monkeypatch, capsys):
    """(it said '.: cannot write (is a directory)', of a folder the user never named)"""
    _, _, run = runs("gpt2")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["attention", "--model", str(run), PROMPT, "--out", "", *extra]) == 2
    assert capsys.readouterr().err == "transformer attention: error: --out is empty; give a path\n"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("family", ["gpt2", "llama2-sp"])
def test_attention_focus_finds_a_word_beside_its_punctuation(runs, family, capsys):
    """'world' in "Hello world, hi there" (a word "world," to the pieces) was 'not a word of
    the text'; it is found, and only its own pieces are read, not the comma's."""
    from transformer.cli._lm import load_language_model, prompt_ids, token_pieces
    from transformer.viz.maps import find_word

    _, _, run = runs(family)
    text = "Hello world, hi there"
    capsys.readouterr()
    assert main(["attention", "--model", str(run), text, "--focus", "there", "--to", "world"]) == 0
    assert "ranked by attention from 'there' to 'world'" in capsys.readouterr().out
    generator = load_language_model(run, {})
    pieces = token_pieces(generator, prompt_ids(generator, text))
    assert "".join(pieces[i] for i in find_word(pieces, "world")).strip("▁ ") == "world"


@pytest.mark.parametrize("extra, option, later", [(["--to", "world"], "--to", "world"),
                                                 (["--to", "Hello", "--vs", "world"], "--vs", "world")])
def test_attention_to_a_later_word_of_a_prompt_is_one_line(runs, extra, option, later, capsys):
    """A causal model's word cannot attend to a later one: every head ranked 0.000, which
    looked like a finding. Refused, naming the option."""
    _, _, run = runs("llama3")
    capsys.readouterr()
    assert main(["attention", "--model", str(run), "Hello big world", "--focus", "big", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"transformer attention: error: {option} {later!r} comes after "
                                                    "--focus 'big' in the text"), err


@pytest.mark.parametrize("stride", ["0", "64", "-1"])
def test_evaluate_text_stride_out_of_range_names_the_option(runs, stride, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", "--model", str(runs("gpt2")[2]), "--text", str(text), "--stride", stride]) == 2
    assert capsys.readouterr().err == ("transformer evaluate: error: --stride must be between 1 and the model's "
                                       f"context minus one (63), got {stride}\n")


# ---- GPT-2: the padding id is a real token --------------------------------------------------

def test_gpt2_attention_reads_its_padding_id_as_text(runs):
    """GPT-2 has no spare id: the import pads with a real token's id. The served attention of a
    text holding that token is HF's, so are the logits."""
    from transformer.serve.attention_maps import lm_attention_maps

    _, hf, run = runs("gpt2")
    generator = greedy(run)
    pad = generator.model.cfg.pad_id
    ids = generator.tokenizer.encode(TEXT)
    assert pad in ids
    maps = lm_attention_maps(generator, TEXT, decimals=6)
    hf.set_attn_implementation("eager")  # the kernel that returns its weights
    tokens = torch.tensor([ids])
    with torch.no_grad():
        theirs = hf(tokens, output_attentions=True)
        masked = generator.model(tokens)  # padding inferred from the ids: that token hidden
        logits = generator.model(tokens, padded=False)
    ours = torch.tensor(maps["self_attention"], dtype=torch.float32)  # (L, H, T, T)
    assert torch.allclose(ours, torch.stack([a[0] for a in theirs.attentions]), atol=1e-5)
    assert (logits - theirs.logits).abs().max() <= 1e-5 < (masked - theirs.logits).abs().max()


def test_gpt2_text_score_reads_its_padding_id_as_text(runs):
    """``transformer evaluate --text`` scores every id as a token, GPT-2's padding id included: HF's loss."""
    from transformer.evaluation.lm import score_ids

    _, hf, run = runs("gpt2")
    generator = greedy(run)
    ids = generator.tokenizer.encode(TEXT)
    assert generator.model.cfg.pad_id in ids and len(ids) <= generator.model.cfg.max_len
    score = score_ids(generator.model, ids)
    with torch.no_grad():
        loss = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert score.nll / score.tokens == pytest.approx(loss, abs=1e-5)


# ---- info -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen2"])
def test_info_names_every_weight(runs, family, capsys):
    _, hf, run = runs(family)
    capsys.readouterr()  # what the import printed
    assert main(["info", "--model", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    model = load_model(run)[0]
    cfg = model.cfg
    assert info["parameters"] == model.num_parameters() == sum(p.numel() for p in hf.parameters())
    names = [m["name"] for m in info["matrices"]]
    assert names[0] == "We" and names[-1] == "Whead"
    per_layer = ["WQ", "WK", "WV", "WO"] + (["W_gate", "W_up", "W_down"] if cfg.ffn_activation == "swiglu"
                                           else ["W_up", "W_down"])
    assert [n for n in names if n.startswith("layer 1 ")] == [f"layer 1 {w}" for w in per_layer]
    wk = next(m for m in info["matrices"] if m["name"] == "layer 1 WK")
    assert wk["shape"] == [cfg.kv_heads * cfg.d_head, cfg.d_model]
    rest = {g["name"]: g["count"] for g in info["others"]}
    assert sum(m["count"] for m in info["matrices"]) + sum(rest.values()) == info["parameters"]
    assert ("q/k/v biases" in rest) == (family == "qwen2")
    if family == "qwen2":
        assert rest["q/k/v biases"] == cfg.n_layers * (cfg.d_model + 2 * cfg.kv_heads * cfg.d_head)
        assert rest["RMSNorm gains"] == (2 * cfg.n_layers + 1) * cfg.d_model
    assert main(["info", "--model", str(run)]) == 0
    text = capsys.readouterr().out
    assert ("q/k/v biases" in text) == (family == "qwen2")


# ---- exports --------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama3", "qwen2", "gpt2"])
def test_ctranslate2_export_computes_the_imported_model(runs, family, tmp_path, capsys):
    """``transformer export --format ctranslate2`` on an imported run: Llama 3's rotary
    scaling, Qwen2's q/k/v biases and padded vocabulary, GPT-2's tied head. CTranslate2's
    logits are ours and its greedy tokens too."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import numpy as np

    _, _, run = runs(family)
    out = tmp_path / "ct2"
    assert main(["export", "--model", str(run), "--format", "ctranslate2", "--out", str(out)]) == 0
    assert "ctranslate2 language model" in capsys.readouterr().out
    assert (out / "tokenizer.json").is_file() and (out / "README.txt").is_file()
    vocab = json.loads((out / "vocabulary.json").read_text(encoding="utf-8"))
    generator = greedy(run, n=30)
    model = generator.model
    assert len(vocab) == model.cfg.vocab_size
    ids = generator.encode(TEXT)  # longer than Llama 3's original context (16): the scaling counts
    assert len(ids) > 16
    theirs = ctranslate2.Generator(str(out), device="cpu", compute_type="float32", intra_threads=1)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), padded=False)[0]  # (T, V)
    ct2_logits = torch.as_tensor(np.array(theirs.forward_batch([[vocab[i] for i in ids]])))[0]
    assert (ct2_logits - logits).abs().max() <= 1e-4
    from transformer.decode.sample import generate_stream

    ours = [int(t) for t in generate_stream(model, [ids], 30, 0.0)]
    result = theirs.generate_batch([[vocab[i] for i in ids]], max_length=30, sampling_topk=1,
                                   include_prompt_in_result=False, end_token=[])
    assert result[0].sequences_ids[0] == ours


def test_ctranslate2_export_names_the_spare_ids(runs, tmp_path):
    """Qwen2's embedding has 8 rows more than its tokenizer has tokens: they get names of their own."""
    pytest.importorskip("ctranslate2")
    _, _, run = runs("qwen2")
    out = tmp_path / "ct2"
    assert main(["export", "--model", str(run), "--format", "ctranslate2", "--out", str(out)]) == 0
    vocab = json.loads((out / "vocabulary.json").read_text(encoding="utf-8"))
    tokens = greedy(run).tokenizer.vocab_size
    assert vocab[tokens:] == [f"<unused_{i}>" for i in range(tokens, tokens + 8)]
    assert len(set(vocab)) == len(vocab)


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_onnx_export_computes_the_imported_model(runs, family, tmp_path, capsys):
    """``transformer export --format onnx`` on an imported run (Llama 3's rotary scaling and
    grouped K/V; Qwen2's q/k/v biases): the step graph's greedy tokens are ours, past the
    original context of Llama 3's scaling."""
    pytest.importorskip("onnxruntime")
    from transformer.decode.sample import generate_stream
    from transformer.interop.onnx_lm import greedy_onnx_lm

    _, _, run = runs(family)
    out = tmp_path / "onnx"
    capsys.readouterr()
    assert main(["export", "--model", str(run), "--format", "onnx", "--out", str(out)]) == 0
    assert "onnx language model, checked with onnxruntime" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"lm_step.onnx", "onnx_config.json", "tokenizer.json", "README.txt"}
    generator = greedy(run)
    ids = generator.encode(TEXT)
    assert len(ids) > 16
    ours = [int(t) for t in generate_stream(generator.model, [ids], 12, 0.0)]
    assert greedy_onnx_lm(out, ids, 12) == ours


def test_a_marian_export_of_a_language_model_is_refused_in_one_line(runs, tmp_path, capsys):
    _, _, run = runs("llama3")
    capsys.readouterr()
    assert main(["export", "--model", str(run), "--format", "marian", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == ("transformer export: error: --format marian exports a translation "
                                               "model; a language model exports to --format ctranslate2 or onnx")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["ctranslate2", "onnx", "marian"])
@pytest.mark.parametrize("out, says", [("", "--out is empty"), (" ", "--out is empty"),
                                       (".", "--out .: the current directory"),
                                       ("./", "--out ./: the current directory")])
def test_export_out_empty_or_the_current_directory_is_one_line(runs, fmt, out, says, tmp_path, monkeypatch, capsys):
    """--out "" is the current directory to the filesystem: in an empty one, the export
    replaced it (the folder the shell stood in was removed, the next command there failed).
    Refused in one line for every format, the current directory left as it was."""
    _, _, run = runs("gpt2")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    capsys.readouterr()
    assert main(["export", "--model", str(run), "--format", fmt, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"transformer export: error: {says}"), err
    assert here.stat().st_ino == inode and not any(here.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]  # no temporary folder beside it


@pytest.mark.parametrize("record", ["{", "[1, 2]"])
def test_export_of_a_run_whose_import_json_is_unreadable_stops_at_eos(runs, record, tmp_path):
    """A damaged import.json ended the export in a JSONDecodeError traceback; generate reads
    the model's EOS then, and so does the export now."""
    pytest.importorskip("ctranslate2")
    _, _, imported = runs("gpt2")
    run = tmp_path / "run"
    shutil.copytree(imported, run)
    (run / "import.json").write_text(record)
    assert main(["export", "--model", str(run), "--format", "ctranslate2", "--out", str(tmp_path / "ct2")]) == 0
    vocab = json.loads((tmp_path / "ct2" / "vocabulary.json").read_text())
    eos = load_model(run)[0].cfg.eos_id
    assert f"end_token={[vocab[eos]]}" in (tmp_path / "ct2" / "README.txt").read_text()


@pytest.mark.parametrize("argv", [["import", "{hf}", "--out", "{file}/run"],
                                  ["export", "--model", "{run}", "--format", "onnx", "--out", "{file}/sub/exp"],
                                  ["attention", "--model", "{run}", PROMPT, "--out", "{file}/a.png"]])
def test_out_under_a_file_names_the_file(runs, argv, tmp_path, capsys):
    """An --out whose folder would be where a file is: mkdir said 'File exists', of a path
    that does not exist; now the file is named."""
    folder, _, run = runs("gpt2")
    (tmp_path / "notes.txt").write_text("mine")
    argv = [a.format(hf=folder, run=run, file=tmp_path / "notes.txt") for a in argv]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(f"({tmp_path / 'notes.txt'} is a file, not a folder)"), err
    assert (tmp_path / "notes.txt").read_text() == "mine" and sorted(tmp_path.iterdir()) == [tmp_path / "notes.txt"]


# ---- the compiled decoding step -------------------------------------------------------------

def test_compiled_step_on_an_imported_run(tmp_path, capfd):
    """``transformer generate --compile on`` on an imported Qwen2 with Llama 3's rotary scaling
    (both features in one model, one build): the compiled step's greedy text is the eager one's."""
    from hf_checkpoints import LLAMA3_ROPE

    folder, _ = build_checkpoint("qwen2", tmp_path / "hf", rope_parameters=LLAMA3_ROPE)
    run = tmp_path / "run"
    assert main(["import", str(folder), "--out", str(run)]) == 0
    cfg = load_model(run)[0].cfg
    assert cfg.qkv_bias and cfg.rope_scaling is not None
    capfd.readouterr()
    argv = ["generate", "--model", str(run), "--prompt", PROMPT, "--max-new-tokens", "40", "--temperature", "0",
            "--precision", "fp32"]
    assert main([*argv, "--compile", "off"]) == 0
    eager = capfd.readouterr()
    assert main([*argv, "--compile", "on"]) == 0
    compiled = capfd.readouterr()
    assert "compiling the decoding step" in compiled.err and "cannot build" not in compiled.err
    assert compiled.out == eager.out and len(eager.out) > len(PROMPT) + 10


@pytest.mark.parametrize("family", ["qwen2", "llama3"])  # a tied head and an untied one
def test_int8_generation_on_an_imported_run(runs, family, capfd, monkeypatch):
    """``generate --precision int8`` on an imported language model: the head (tied or not)
    is quantised like every other linear layer, and the compiled step gives the eager text
    (its cache in the dtype the int8 layers compute in). The compiled step multiplies
    weight-only (dequantised weights); so does eager decoding where bf16 is native, and the
    reference here does it on every CPU (elsewhere eager int8 takes an int8 GEMM, which also
    quantises the activations: other numbers)."""
    from transformer import hardware
    from transformer.decode import choose

    run = runs(family)[2]
    argv = ["generate", "--model", str(run), "--prompt", PROMPT, "--max-new-tokens", "24", "--temperature", "0",
            "--precision", "int8"]
    capfd.readouterr()
    assert main([*argv, "--compile", "off"]) == 0  # as the CPU decodes it (int8 GEMM or weight-only)
    eager = capfd.readouterr()
    assert eager.err == "" and len(eager.out) > len(PROMPT)
    if family == "qwen2":  # one build is enough to check the compiled step's cache
        kernel = "weight-only-bf16" if hardware.cpu_has_native_bf16() else "weight-only-fp32"
        monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
        assert main([*argv, "--compile", "off"]) == 0
        weight_only = capfd.readouterr()
        assert main([*argv, "--compile", "on"]) == 0
        compiled = capfd.readouterr()
        assert "cannot build" not in compiled.err and compiled.out == weight_only.out
