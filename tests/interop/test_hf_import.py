"""``transformer import`` on tiny Hugging Face checkpoints built in the test: the run computes
HF's logits, continues a prompt as HF's ``generate`` does, and tokenizes as ``AutoTokenizer``
does; bad input is refused in one line and leaves no run behind."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from hf_checkpoints import FAMILIES, PROMPT, TEXT, build_checkpoint
from hf_checkpoints import copy_folder as _copy
from hf_checkpoints import refused_import as _refused
from transformer.cli import main
from transformer.data.text import load_tokenizer
from transformer.inference.generator import Generator, TextPieces
from transformer.run import load_model

pytest.importorskip("transformers")


def import_run(source: Path, out: Path) -> int:
    return main(["import", str(source), "--out", str(out)])


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request, tmp_path_factory):
    """(family, HF folder, HF model, run directory) for each family, imported once."""
    root = tmp_path_factory.mktemp(request.param)
    folder, hf = build_checkpoint(request.param, root / "hf")
    assert import_run(folder, root / "run") == 0
    return request.param, folder, hf, root / "run"


def test_logits_equal_hf(imported):
    family, _, hf, run = imported
    model, _ = load_model(run)
    ids = torch.tensor([load_tokenizer(run).encode(TEXT)])
    real = None if family != "gpt2" else torch.ones_like(ids, dtype=torch.bool)  # GPT-2: pad_id is a real token
    with torch.no_grad():
        diff = (model(ids, real=real) - hf(ids).logits).abs().max().item()
    assert diff <= 1e-5, f"{family}: max abs logit difference {diff}"


def test_padding_id_is_no_text(imported):
    """Where the vocabulary has an id no text encodes to, padding is that id."""
    family, _, _, run = imported
    pad = load_model(run)[0].cfg.pad_id
    assert (pad in load_tokenizer(run).encode(TEXT + "!\"#$%&'()*+,-./0123456789")) == (family == "gpt2")


def test_the_family_is_what_the_model_says(imported):
    family, _, _, run = imported
    cfg = load_model(run)[0].cfg
    assert cfg.tie_embeddings == (family in ("gpt2", "llama2-sp", "qwen2"))
    assert (cfg.rope_scaling is not None) == (family == "llama3")
    assert cfg.qkv_bias == (family == "qwen2") and not cfg.bias == (family != "gpt2")
    assert (cfg.n_kv_heads == 2) == (family != "gpt2")


def test_greedy_continuation_equals_hf_generate(imported):
    family, _, hf, run = imported
    generator = Generator.from_pretrained(run, precision="fp32", compile="off", temperature=0.0,
                                          max_new_tokens=16)
    ids = generator.encode(PROMPT)
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      max_new_tokens=16, do_sample=False, pad_token_id=generator.model.cfg.eos_id)
    expected = generator.tokenizer.decode(out[0, len(ids):].tolist())
    assert generator.generate([PROMPT]) == [expected], family


def test_generation_stops_at_eos_as_hf(imported):
    """With EOS set to the token HF's greedy run produces third, both stop there."""
    family, _, hf, run = imported
    generator = Generator.from_pretrained(run, precision="fp32", compile="off", temperature=0.0,
                                          max_new_tokens=12)
    ids = generator.encode(PROMPT)
    free = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(ids):].tolist()
    stop = free[2]
    if stop == generator.model.cfg.pad_id:
        pytest.skip(f"{family}: the third token is the padding id")
    generator.model.cfg = generator.model.cfg.replace(eos_id=stop)
    generator.stop_id = stop
    end = free.index(stop) + 1
    steps = list(generator.stream([PROMPT]))  # one step a token, then what finish() held back
    assert end <= len(steps) <= end + 1 < len(free)
    assert "".join(p[0] for p in steps) == generator.tokenizer.decode(free[:end])


def test_tokenizer_equals_autotokenizer(imported):
    from transformers import AutoTokenizer

    family, folder, _, run = imported
    theirs, ours = AutoTokenizer.from_pretrained(folder), load_tokenizer(run)
    for text in (TEXT, PROMPT, " leading space", "🙂"):
        if family == "llama2-sp" and text.startswith(" "):
            continue  # HF converts a bare tokenizer.model with a Metaspace that drops a leading space (below)
        ids = theirs(text)["input_ids"]
        assert ours.encode(text) == ids, (family, text)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), (family, text)
    assert ours.decode(ours.encode(TEXT)).strip() == TEXT.strip()


@pytest.mark.parametrize("imported", ["llama2-sp"], indirect=True)
def test_sentencepiece_is_used_as_trained(imported):
    """A bare tokenizer.model is sentencepiece itself, BOS first (Meta's Llama 2 tokenizer, and
    what HF's own tokenizer.json for Llama 2 computes, a leading space included)."""
    import sentencepiece as spm

    _, folder, _, run = imported
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    for text in (TEXT, " leading space"):
        assert load_tokenizer(run).encode(text) == [sp.bos_id(), *sp.encode(text)]


def test_streamed_pieces_hold_back_partial_characters(imported):
    """Byte-level BPE splits an emoji across tokens: the pieces never show U+FFFD and join to
    the text, also for a text of hundreds of tokens, of which no more than a window is ever
    decoded at once (a long generation costs the same per token, in bounded memory)."""
    _, _, _, run = imported
    tokenizer = load_tokenizer(run)
    decoded_lengths = []
    decode = tokenizer.decode
    for text in (TEXT, " ".join([TEXT] * 30)):
        ids = tokenizer.encode(text)
        pieces = TextPieces(tokenizer)
        tokenizer.decode = lambda ids: decoded_lengths.append(len(ids)) or decode(ids)
        shown = [pieces.add(i) for i in ids] + [pieces.finish()]
        tokenizer.decode = decode
        assert "".join(shown) == tokenizer.decode(ids)
        assert not any("\ufffd" in p for p in shown)
    assert len(ids) > 200 and max(decoded_lengths) <= 2 * TextPieces.CONTEXT + 4


def test_run_directory(imported):
    family, folder, _, run = imported
    model, meta = load_model(run)
    assert Path(meta["path"]).name == "best.safetensors"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"] == model.cfg.to_dict()
    assert config["decoding"]["temperature"] == 0.0  # HF generates greedily unless do_sample
    record = json.loads((run / "import.json").read_text())
    assert record["family"] == {"llama3": "llama", "llama2-sp": "llama"}.get(family, family)
    assert record["source"] == str(folder.resolve())
    tokenizer_file = "tokenizer.model" if family == "llama2-sp" else "tokenizer.json"
    assert (run / tokenizer_file).is_file()


def test_info_shows_the_matrices(imported, capsys):
    _, _, _, run = imported
    assert main(["info", "--model", str(run)]) == 0
    out = capsys.readouterr().out
    assert "decoder-only language model" in out and "layer 2 WQ" in out and "Whead" in out


# ---- refusals ---------------------------------------------------------------------------
@pytest.fixture
def gpt2_folder(hf_folders):
    return hf_folders("gpt2")


def test_unsupported_architecture(gpt2_folder, tmp_path, capsys):
    folder = _copy(gpt2_folder, tmp_path / "bert")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    _refused(folder, tmp_path / "run", capsys, "bert", "not supported")


def test_missing_tokenizer(gpt2_folder, tmp_path, capsys):
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / "tokenizer.json").unlink()
    _refused(folder, tmp_path / "run", capsys, "no tokenizer")


def test_config_without_model_type(gpt2_folder, tmp_path, capsys):
    folder = _copy(gpt2_folder, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    err = _refused(folder, tmp_path / "run", capsys, f"{folder / 'config.json'}: no model_type", "gpt2, llama")
    assert "None" not in err


@pytest.mark.parametrize("name, says", [("tokenizer.json", "not a readable tokenizer.json"),
                                        ("tokenizer_config.json", "not a readable tokenizer config")])
def test_corrupt_tokenizer_file_is_named_where_it_is(gpt2_folder, name, says, tmp_path, capsys):
    """The line names the source's file, not its copy in the temporary folder (which is gone)."""
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / name).write_text('{"version": ')
    err = _refused(folder, tmp_path / "run", capsys, f"{folder / name}: {says}")
    assert ".tmp" not in err


def test_out_naming_a_file_is_refused(gpt2_folder, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert import_run(gpt2_folder, tmp_path / "notes.txt") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notes.txt: a file, not a folder; give a new run directory" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("family, changes, says", [
    ("gpt2", {"eos_token_id": 99999}, "eos_id=99999 is outside the vocabulary of 374"),
    ("gpt2", {"layer_norm_epsilon": "big"}, "'layer_norm_epsilon' expected float, got str"),
    ("llama3", {"num_attention_heads": 3}, "is not a multiple of the number of attention heads (3)"),
    ("llama3", {"max_position_embeddings": 0}, "max_position_embeddings must be a positive whole number, got 0"),
])
def test_a_config_json_transformers_refuses_is_one_line_naming_it(family, changes, says, tmp_path, capsys):
    """One stderr line naming config.json: transformers' own log lines ("eos_token_id must be
    ... within the vocabulary", a rope check) no longer come first, and a validation error of
    huggingface_hub's (Llama's heads; not a ValueError) is no longer a traceback."""
    folder = _with_config(build_checkpoint(family, tmp_path / "hf")[0], **changes)
    _refused(folder, tmp_path / "run", capsys, f"{folder / 'config.json'}: ", says)


@pytest.mark.parametrize("family, changes, says", [
    ("gpt2", {"n_positions": 32}, "config.json: n_positions is 32, but the checkpoint's transformer.wpe.weight has "
                                  "the shape (64, 32)"),
    ("llama3", {"num_key_value_heads": 4}, "the checkpoint's model.layers.0.self_attn.k_proj.weight gives "
                                           "decoder.layers.0.self_attn.k_proj.weight the shape (16, 32), where "
                                           "config.json asks for (32, 32)"),
])
def test_weights_config_json_does_not_describe_name_the_checkpoints_tensor(family, changes, says, tmp_path, capsys):
    """(the line named only our tensor, positions.weight, which is in no file the user has; now
    config.json's key and the checkpoint's tensor, or the checkpoint's tensor)"""
    folder = _with_config(build_checkpoint(family, tmp_path / "hf")[0], **changes)
    _refused(folder, tmp_path / "run", capsys, f"error: {folder}", f"{says}; the weights and config.json do not belong "
             "together")


def test_truncated_safetensors(gpt2_folder, tmp_path, capsys):
    folder = _copy(gpt2_folder, tmp_path / "hf")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    _refused(folder, tmp_path / "run", capsys, "truncated")


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_pickle_that_runs_code_is_refused(gpt2_folder, tmp_path, capsys):
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({"transformer.wte.weight": RunsCode(marker)}, folder / "pytorch_model.bin")
    _refused(folder, tmp_path / "run", capsys, "pytorch_model.bin", "refused")
    assert not marker.exists()


def test_custom_code_in_the_folder_never_runs(gpt2_folder, tmp_path, monkeypatch, capsys):
    """A tokenizer_config.json / config.json auto_map naming a Python file of the folder: the
    import asks transformers for no remote code (transformers would otherwise ask on the
    terminal whether to run it, where it has no class of its own), and the file never runs."""
    import transformers

    folder = _copy(gpt2_folder, tmp_path / "hf")
    marker = tmp_path / "ran"
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                      "from transformers import PreTrainedTokenizerFast, GPT2Config\n"
                                      "class Custom(PreTrainedTokenizerFast): pass\n"
                                      "class CustomConfig(GPT2Config): pass\n")
    _with_config(folder, auto_map={"AutoConfig": "custom.CustomConfig"})
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**config, "tokenizer_class": "Custom", "auto_map": {"AutoTokenizer": [None, "custom.Custom"]}}))
    asked = []
    for auto in (transformers.AutoConfig, transformers.AutoTokenizer):
        def recording(*args, _real=auto.from_pretrained, **kwargs):
            asked.append(kwargs.get("trust_remote_code"))
            return _real(*args, **kwargs)
        monkeypatch.setattr(auto, "from_pretrained", recording)
    assert import_run(folder, tmp_path / "run") == 0
    assert len(asked) >= 2 and set(asked) == {False} and not marker.exists()


def test_pytorch_model_bin(gpt2_folder, tmp_path):
    """A plain state dict in pytorch_model.bin imports as the safetensors file does."""
    from safetensors.torch import load_file

    folder = _copy(gpt2_folder, tmp_path / "hf")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert import_run(folder, tmp_path / "run") == 0
    assert import_run(gpt2_folder, tmp_path / "reference") == 0
    ours, reference = load_model(tmp_path / "run")[0], load_model(tmp_path / "reference")[0]
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), reference.state_dict().values()))


def test_sharded_safetensors(tmp_path):
    folder, hf = build_checkpoint("qwen2", tmp_path / "hf")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    for f in folder.glob("tokenizer*"):
        (tmp_path / "sharded" / f.name).write_bytes(f.read_bytes())
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert import_run(tmp_path / "sharded", tmp_path / "run") == 0
    ids = torch.tensor([load_tokenizer(tmp_path / "run").encode(TEXT)])
    with torch.no_grad():
        assert (load_model(tmp_path / "run")[0](ids) - hf(ids).logits).abs().max() <= 1e-5


def test_existing_run_is_refused(gpt2_folder, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    assert import_run(gpt2_folder, tmp_path / "run") == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("out, says", [("", "--out is empty"), (".", "--out .: the current directory")])
def test_out_empty_or_the_current_directory_is_one_line(gpt2_folder, out, says, tmp_path, monkeypatch, capsys):
    """--out "" (the current directory to the filesystem) or "." in an empty folder: the
    import would replace the folder the shell stands in; refused, nothing written."""
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["import", str(gpt2_folder), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"transformer import: error: {says}"), err
    assert not any(tmp_path.iterdir())


def test_generation_config_values_our_decoding_refuses_are_left_out(gpt2_folder, tmp_path, capsys):
    """A generation_config.json value our decoding refuses was written into config.yaml, and
    every command on the run then refused it: it is left out with one warning line each, the
    run decodes with the default, and what is usable is kept (top_k 40.0 as 40, temperature 2 as 2.0)."""
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 2, "top_k": 40.0, "top_p": 1.5, "max_new_tokens": 0}))
    capsys.readouterr()
    assert import_run(folder, tmp_path / "run") == 0
    warnings = capsys.readouterr().err.splitlines()
    path = folder / "generation_config.json"
    assert warnings == [f"warning: {path}: top_p must be in (0, 1], got 1.5; the run decodes with top_p 1.0 "
                        "(give --top-p to choose)",
                        f"warning: {path}: max_new_tokens must be at least 1, got 0; the run decodes with "
                        "max_new_tokens 256 (give --max-new-tokens to choose)"]
    decoding = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["decoding"]
    assert decoding == {"temperature": 2.0, "top_k": 40, "top_p": 1.0}
    assert main(["generate", "--model", str(tmp_path / "run"), "--prompt", PROMPT, "--max-new-tokens", "2",
                 "--seed", "1"]) == 0


def test_a_temperature_that_is_no_number_is_left_out(gpt2_folder, tmp_path, capsys):
    """(it ended the import in a traceback: float('hot'))"""
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": "hot"}))
    capsys.readouterr()
    assert import_run(folder, tmp_path / "run") == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and err.count("\n") == 1
    assert "generation_config.json: temperature must be a" in err
    assert "got 'hot'; the run decodes with temperature 1.0" in err
    decoding = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["decoding"]
    assert decoding == {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


@pytest.mark.parametrize("source", ["", " "])
def test_an_empty_source_is_one_line(source, tmp_path, monkeypatch, capsys):
    """'' is the current folder to the filesystem (a hub look-up for ' '): neither is meant."""
    _copy(build_checkpoint("gpt2", tmp_path / "hf")[0], tmp_path / "here")
    monkeypatch.chdir(tmp_path / "here")  # a model folder: it was imported
    capsys.readouterr()
    assert main(["import", source, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == "transformer import: error: SOURCE is empty; give a Hugging Face model folder or a hub id " \
                  "(name or owner/name)\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("to", ["empty", "nowhere"])
def test_out_naming_a_symbolic_link_is_one_line(gpt2_folder, to, tmp_path, capsys):
    """(it said 'cannot write the run (Not a directory)')"""
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / to)
    capsys.readouterr()
    assert import_run(gpt2_folder, tmp_path / "link") == 2
    err = capsys.readouterr().err
    assert err == f"transformer import: error: --out {tmp_path / 'link'}: a symbolic link (to {tmp_path / to}); " \
                  "give the directory itself\n"
    assert (tmp_path / "link").is_symlink() and not any((tmp_path / "empty").iterdir())


def test_tensors_config_json_does_not_describe_are_named(gpt2_folder, tmp_path, capsys):
    """config.json with 1 layer over a 2-layer checkpoint imported the first layer and said
    nothing (as HF loads it, with a log line): one warning line now names what is left over.
    A checkpoint read whole gives none (GPT-2's causal-mask buffers are no weights)."""
    from safetensors.torch import load_file, save_file

    folder = _copy(gpt2_folder, tmp_path / "hf")
    state = load_file(folder / "model.safetensors")
    save_file({**state, "transformer.h.0.attn.bias": torch.ones(1, 1, 64, 64)}, folder / "model.safetensors",
              metadata={"format": "pt"})
    capsys.readouterr()
    assert import_run(folder, tmp_path / "whole") == 0
    assert capsys.readouterr().err == ""
    _with_config(folder, n_layer=1)
    assert import_run(folder, tmp_path / "run") == 0
    err = capsys.readouterr().err
    assert err == (f"warning: {folder}: 12 tensor(s) of the checkpoint are not used (transformer.h.1.attn.c_attn.bias, "
                   "transformer.h.1.attn.c_attn.weight, transformer.h.1.attn.c_proj.bias, ...); does config.json "
                   "describe these weights?\n")
    assert load_model(tmp_path / "run")[0].cfg.n_layers == 1


def test_sliding_window_is_refused(tmp_path, capsys):
    folder, _ = build_checkpoint("mistral", tmp_path / "hf", sliding_window=8)
    _refused(folder, tmp_path / "run", capsys, "sliding_window")


def test_other_rope_types_are_refused(tmp_path, capsys):
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    folder = _with_config(build_checkpoint("llama3", tmp_path / "hf")[0], rope_parameters=rope)
    _refused(folder, tmp_path / "run", capsys, "linear", "not supported")


def _with_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_hub_id_is_fetched_with_snapshot_download(gpt2_folder, tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    asked = {}

    def snapshot_download(repo_id, allow_patterns=None, **_):
        asked.update(repo_id=repo_id, patterns=allow_patterns)
        return str(gpt2_folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    assert import_run(Path("someone/tiny-gpt2"), tmp_path / "run") == 0
    assert asked["repo_id"] == "someone/tiny-gpt2" and {"*.safetensors", "*.spm"} <= set(asked["patterns"])
    assert not any(p.endswith(".bin") for p in asked["patterns"])  # the folder has safetensors weights
    assert json.loads((tmp_path / "run" / "import.json").read_text())["source"] == "hf://someone/tiny-gpt2"


def test_a_hub_repository_without_safetensors_gives_its_pytorch_model_bin(tmp_path, monkeypatch):
    """An older repository (opus-mt's) holds pytorch_model.bin only: a second download
    fetches it (then read with weights_only=True)."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    folder, _ = build_checkpoint("gpt2", tmp_path / "hf")
    import safetensors.torch

    torch.save(safetensors.torch.load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    asked = []

    def snapshot_download(repo_id, allow_patterns=None, **_):
        asked.append(list(allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    assert import_run(Path("someone/old-gpt2"), tmp_path / "run") == 0
    assert len(asked) == 2 and "pytorch_model*.bin" in asked[1] and "pytorch_model*.bin" not in asked[0]
    assert load_model(tmp_path / "run")[0].cfg.vocab_size > 0


# ---- the other commands on an imported run ---------------------------------------------------
@pytest.mark.parametrize("imported", ["llama3", "gpt2"], indirect=True)
def test_commands_read_the_run(imported, tmp_path, capsys):
    """generate prints HF's greedy continuation, evaluate --text HF's loss; attention and
    explain run."""
    family, _, hf, run = imported
    tokenizer = load_tokenizer(run)
    ids = tokenizer.encode(PROMPT)
    out = hf.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, pad_token_id=0)
    capsys.readouterr()
    assert main(["generate", "--model", str(run), "--prompt", PROMPT, "--max-new-tokens", "5",
                 "--temperature", "0", "--precision", "fp32"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == PROMPT + tokenizer.decode(out[0, len(ids):].tolist())

    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    assert main(["evaluate", "--model", str(run), "--text", str(tmp_path / "text.txt"), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ids = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss.item()
    assert scored["cross_entropy"] == pytest.approx(loss, abs=1e-4), family

    assert main(["attention", "--model", str(run), "--out", str(tmp_path / "attention.png"), PROMPT]) == 0
    assert (tmp_path / "attention.png").stat().st_size > 0
    assert main(["explain", "--model", str(run), PROMPT]) == 0
    assert "bit-identical" in capsys.readouterr().out


# ---- the Python API over the same name map ---------------------------------------------------
@pytest.mark.parametrize("imported", ["llama3", "qwen2", "mistral"], indirect=True)
def test_from_llama_reads_every_llama_shaped_family(imported):
    """``from_llama`` takes Llama 3 (rope scaling), Qwen2 and Mistral models; ``to_llama``
    gives back Llama 3 with its rope scaling (Qwen2's q/k/v-only biases have no Llama form)."""
    from transformer.interop import from_llama, to_llama

    family, _, hf, _ = imported
    ours = from_llama(hf).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 63, 12]])
    real = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        assert (ours(ids, real=real) - hf(ids).logits).abs().max() <= 1e-5
        if family == "qwen2":
            with pytest.raises(ValueError, match="qkv_bias"):
                to_llama(ours)
        else:
            assert (to_llama(ours).eval()(ids).logits - hf(ids).logits).abs().max() <= 1e-5


def test_generation_stops_at_any_of_the_models_stop_ids(tmp_path):
    """generation_config.json may list several EOS ids (Llama 3 Instruct ends a turn with
    <|eot_id|>): the import records them all, and generation stops at any, as HF's does."""
    import json

    from transformers import AutoTokenizer

    folder, hf = build_checkpoint("llama3", tmp_path / "hf")
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT)["input_ids"]
    free = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(ids):].tolist()
    stop = free[2]
    eos = hf.config.eos_token_id
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, stop], "do_sample": False}),
                                                   encoding="utf-8")
    theirs = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=[eos, stop],
                         pad_token_id=0)[0, len(ids):].tolist()
    assert import_run(folder, tmp_path / "run") == 0
    assert json.loads((tmp_path / "run" / "import.json").read_text())["stop_ids"] == [eos, stop]
    generator = Generator.from_pretrained(tmp_path / "run", precision="fp32", compile="off", max_new_tokens=12)
    assert generator.stop_id == [eos, stop]
    end = free.index(stop) + 1
    assert theirs == free[:end] and end < len(free)
    assert generator.generate([PROMPT]) == [generator.tokenizer.decode(free[:end])]


def test_stop_ids_outside_the_vocabulary_are_left_out(gpt2_folder, tmp_path):
    """generation_config.json's eos_token_id [EOS, 5, 99999, true]: 99999 is no token and
    true no id. They were recorded, and an export, finding a stop id outside the vocabulary,
    then dropped the whole list (5 too) for the model's EOS alone."""
    pytest.importorskip("ctranslate2")
    folder = _copy(gpt2_folder, tmp_path / "hf")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5, 99999, True]}))
    assert import_run(folder, tmp_path / "run") == 0
    assert json.loads((tmp_path / "run" / "import.json").read_text())["stop_ids"] == [0, 5]
    assert main(["export", "--model", str(tmp_path / "run"), "--format", "ctranslate2", "--out",
                 str(tmp_path / "ct2")]) == 0
    vocab = json.loads((tmp_path / "ct2" / "vocabulary.json").read_text())
    assert f"end_token={[vocab[0], vocab[5]]}" in (tmp_path / "ct2" / "README.txt").read_text()


@pytest.mark.parametrize("imported", ["gpt2"], indirect=True)
def test_explain_training_on_an_imported_run_is_one_line(imported, capsys):
    _, _, _, run = imported
    capsys.readouterr()
    assert main(["explain", "--model", str(run), "--training"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an imported model, with no training data" in err


def test_import_says_how_to_build_the_compiled_step(gpt2_folder, tmp_path, capsys):
    """The second line of what import prints is the command that builds the compiled step,
    which ``--compile auto`` uses once built but does not build for a short generation."""
    assert import_run(gpt2_folder, tmp_path / "run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("imported gpt2 (")
    assert f"'transformer generate --model {tmp_path / 'run'} --compile on'" in lines[1]
