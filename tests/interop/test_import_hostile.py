"""``transformer import`` of a folder someone else made (a hub repository, an archive): its
config.json, shard index, links and pickles are data. None of them makes the import eat the
memory, read or write outside the folders the user named, or run code: each is refused in one
line (exit 2) and leaves no run. And an import.json whose ``stop_ids`` are no ids of the model
is one line from ``generate`` and ``export``. The folders are tiny random checkpoints, built once
a session (conftest.py: hf_checkpoints.py, test_marian_import.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hf_checkpoints import PROMPT
from hf_checkpoints import copy_folder as _copy
from hf_checkpoints import refused_import as _refused
from transformer.cli import main
from transformer.run import file_sha256, load_model

pytest.importorskip("transformers")

HUGE = 10 ** 9
DROP = object()  # a key taken out of config.json
LONG = "9" * 5000  # more digits than Python turns into an int


def _with_config(folder: Path, changes: dict) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config = {k: "LONG" if v is LONG else v for k, v in {**config, **changes}.items() if v is not DROP}
    text = json.dumps(config).replace('"LONG"', LONG)  # (json.dumps cannot write the number either)
    (folder / "config.json").write_text(text)
    return folder


# ---- config.json's sizes: checked against the tensors before anything is built -------------------
CONFIGS = [  # (family, config.json changes, what the one line says after "FOLDER/config.json: ")
    ("gpt2", {"n_layer": HUGE}, "n_layer is 1000000000, but the checkpoint has 2 layer(s) (transformer.h.N) and no "
                                "transformer.h.2"),
    ("llama3", {"num_hidden_layers": HUGE}, "num_hidden_layers is 1000000000, but the checkpoint has 2 layer(s)"),
    # Qwen2's config class lists one attention type a layer when config.json gives none
    ("qwen2", {"num_hidden_layers": HUGE, "layer_types": DROP}, "num_hidden_layers is 1000000000, but the checkpoint"),
    ("marian", {"encoder_layers": HUGE, "decoder_layers": HUGE}, "encoder_layers is 1000000000, but the checkpoint "
                                                                 "has 2 layer(s) (model.encoder.layers.N)"),
    ("marian", {"max_position_embeddings": HUGE}, "max_position_embeddings is 1000000000: a position table of "
                                                  "32000000000 numbers, where the checkpoint holds"),
    ("llama3", {"max_position_embeddings": HUGE}, "max_position_embeddings is 1000000000: a position table"),
    ("gpt2", {"n_embd": HUGE}, "n_embd is 1000000000, but the checkpoint's transformer.wte.weight has the shape "
                               "(374, 32)"),
    ("qwen2", {"intermediate_size": HUGE}, "intermediate_size is 1000000000, but the checkpoint's "
                                           "model.layers.0.mlp.up_proj.weight has the shape (64, 32)"),
    ("marian", {"vocab_size": HUGE}, "vocab_size is 1000000000, but the checkpoint's model.shared.weight"),
    ("gpt2", {"n_layer": 1e9}, "n_layer must be a positive whole number, got 1000000000.0"),
    ("llama3", {"num_hidden_layers": True}, "num_hidden_layers must be a positive whole number, got True"),
    ("marian", {"d_model": "32"}, "d_model must be a positive whole number, got '32'"),
    ("qwen2", {"hidden_size": -32}, "hidden_size must be a positive whole number, got -32"),
    ("gpt2", {"n_layer": LONG}, "not readable JSON (Exceeds the limit (4300 digits)"),
]

# Imports each folder under a cap on the process's data (RLIMIT_DATA: what malloc and anonymous
# maps take, not the libraries' mapped files), so that a size that is built again fails with
# "out of memory" (wrong words) instead of taking the machine; the timeout is a guard for one
# that would build slowly within the cap, not a measurement.
CHILD = r"""
import contextlib, io, json, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
from transformer.cli import main
results = []
for source, out in json.loads(sys.argv[2]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["import", source, "--out", out])
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_config_sizes_the_checkpoint_does_not_have_are_one_line_in_bounded_memory(hf_folders, tmp_path):
    """A config.json of 10**9 layers grew the import to GBs (built on the meta device, Marian's
    names listed, Qwen2's layer list) and Marian's 10**9 positions asked for 7.5 GiB; Llama's
    made a run that no command opens. Each is now one line naming the key, in one process
    whose data is capped at 3 GiB."""
    cases = []
    for k, (family, changes, _) in enumerate(CONFIGS):
        folder = _with_config(_copy(hf_folders(family), tmp_path / f"hf{k}"), changes)
        cases.append([str(folder), str(tmp_path / f"run{k}")])
    child = subprocess.run([sys.executable, "-c", CHILD, str(3 << 30), json.dumps(cases)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert child.returncode == 0, child.stderr[-2000:]
    results = json.loads(child.stdout.strip().splitlines()[-1])
    for (source, out), (code, err), (family, changes, says) in zip(cases, results, CONFIGS):
        assert code == 2 and len(err.strip().splitlines()) == 1, (family, changes, err)
        assert f"{source}/config.json: {says}" in err, (family, changes, err)
        assert not Path(out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]  # no temporary folder left


# ---- import.json's stop ids ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_run(hf_folders, tmp_path_factory):
    run = tmp_path_factory.mktemp("imported") / "run"
    assert main(["import", str(hf_folders("gpt2")), "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize("stops, shown", [([1e30], "1e+30"), ([10 ** 30], str(10 ** 30)), ([0, 374], "374"),
                                          ([-1], "-1"), ([True], "True"), (["0"], "'0'"), ([None], "None"),
                                          (5, "5")])
def test_stop_ids_that_are_no_ids_of_the_model_are_one_line(gpt2_run, stops, shown, tmp_path, capsys):
    """``stop_ids: [10**30]`` was "Overflow when unpacking long long" from deep in sampling, and
    [1e30] was dropped in silence by generate but not by export (two readers, two checks)."""
    run = _copy(gpt2_run, tmp_path / "run")
    record = json.loads((run / "import.json").read_text())
    (run / "import.json").write_text(json.dumps({**record, "stop_ids": stops}))
    capsys.readouterr()
    assert main(["generate", "--model", str(run), "--prompt", PROMPT, "--max-new-tokens", "2", "--compile", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"transformer generate: error: {run / 'import.json'}: stop_ids must "
                                               "list token ids of the model (whole numbers from 0 to 373), "
                                               f"got {shown}; "), err


@pytest.mark.parametrize("fmt", ["ctranslate2", "onnx"])
def test_export_reads_stop_ids_as_generate_does(gpt2_run, fmt, tmp_path, capsys):
    run = _copy(gpt2_run, tmp_path / "run")
    record = json.loads((run / "import.json").read_text())
    (run / "import.json").write_text(json.dumps({**record, "stop_ids": [0, 10 ** 30]}))
    capsys.readouterr()
    assert main(["export", "--model", str(run), "--format", fmt, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'import.json'}: stop_ids must list token ids" in err[0], err
    assert not (tmp_path / "out").exists()


# ---- a shard index names files inside the folder only -------------------------------------------
def _sharded(hf_folders, tmp_path: Path, named: str, kind: str) -> Path:
    """The GPT-2 folder with its weights moved out to tmp_path/outside.*, its index naming ``named``."""
    folder = _copy(hf_folders("gpt2"), tmp_path / "hf")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    if kind == "bin":
        from safetensors.torch import load_file

        torch.save(load_file(folder / "model.safetensors"), tmp_path / "outside.bin")
        (folder / "model.safetensors").unlink()
        index = folder / "pytorch_model.bin.index.json"
    else:
        shutil.move(folder / "model.safetensors", tmp_path / "outside.safetensors")
        index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {name: named.format(tmp=tmp_path) for name in names}}))
    return index


@pytest.mark.parametrize("named, kind", [("../outside.safetensors", "safetensors"),
                                         ("{tmp}/outside.safetensors", "safetensors"),
                                         ("sub/../../outside.safetensors", "safetensors"),
                                         ("/etc/passwd", "safetensors"), ("../outside.bin", "bin")])
def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(hf_folders, named, kind, tmp_path, capsys):
    """``../outside.safetensors`` was imported from outside the folder, and /etc/passwd opened."""
    index = _sharded(hf_folders, tmp_path, named, kind)
    _refused(index.parent, tmp_path / "run", capsys,
             f"{index}: names {named.format(tmp=tmp_path)!r}, which is not a file of the model folder")


# ---- links ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, name", [("gpt2", "tokenizer_config.json"), ("gpt2", "config.json"),
                                          ("gpt2", "model.safetensors"), ("marian", "source.spm"),
                                          ("marian", "vocab.json")])
def test_a_link_out_of_the_folder_is_refused(hf_folders, family, name, tmp_path, capsys):
    """A tokenizer_config.json linked to a file outside the folder was read and copied into the
    run; now no file is read through a link that leaves the folder."""
    folder = _copy(hf_folders(family), tmp_path / "hf")
    private = tmp_path / "private"
    private.mkdir()
    shutil.move(folder / name, private / name)
    (folder / name).symlink_to(Path("..") / "private" / name)
    _refused(folder, tmp_path / "run", capsys, f"{folder / name}: a symbolic link to ../private/{name}, outside "
                                               "the model folder")


def test_a_linked_folder_out_of_the_folder_is_refused(hf_folders, tmp_path, capsys):
    folder = _copy(hf_folders("gpt2"), tmp_path / "hf")
    (folder / "extra").symlink_to(tmp_path)
    _refused(folder, tmp_path / "run", capsys, f"{folder / 'extra'}: a symbolic link to {tmp_path}, outside")


def test_a_link_inside_the_folder_is_read(hf_folders, tmp_path):
    folder = _copy(hf_folders("gpt2"), tmp_path / "hf")
    (folder / "kept").mkdir()
    shutil.move(folder / "tokenizer.json", folder / "kept" / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(Path("kept") / "tokenizer.json")
    assert main(["import", str(folder), "--out", str(tmp_path / "run")]) == 0
    assert not (tmp_path / "run" / "tokenizer.json").is_symlink()


def _hub_snapshot(folder: Path, hub: Path, repo: str = "models--org--tiny") -> Path:
    """``folder`` as huggingface_hub caches it: each file a link snapshots/<rev>/NAME ->
    ../../blobs/<sha256>."""
    snapshot, blobs = hub / repo / "snapshots" / "0123abcd", hub / repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir(parents=True)
    for f in folder.iterdir():
        sha = file_sha256(f)
        shutil.copyfile(f, blobs / sha)
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / sha)
    return snapshot


def test_a_hub_cache_snapshot_reads_its_repositorys_blobs(hf_folders, tmp_path, capsys):
    """The hub's cache is links from a snapshot to its repository's blobs: read; a link from it
    to another repository's blob, or beyond, is not."""
    snapshot = _hub_snapshot(hf_folders("gpt2"), tmp_path / "hub")
    assert main(["import", str(snapshot), "--out", str(tmp_path / "run")]) == 0
    assert main(["import", str(hf_folders("gpt2")), "--out", str(tmp_path / "direct")]) == 0
    ours, direct = load_model(tmp_path / "run")[0].state_dict(), load_model(tmp_path / "direct")[0].state_dict()
    assert all(torch.equal(ours[k], direct[k]) for k in direct)

    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    (other / "secret").write_text("{}")
    (snapshot / "special_tokens_map.json").symlink_to(Path("..") / ".." / ".." / "models--someone--else" / "blobs"
                                                      / "secret")
    _refused(snapshot, tmp_path / "again", capsys, f"{snapshot / 'special_tokens_map.json'}: a symbolic link to "
                                                   "../../../models--someone--else/blobs/secret, outside")


@pytest.mark.parametrize("family, name", [("gpt2", "tokenizer_config.json"), ("gpt2", "best.safetensors"),
                                          ("marian", "source.spm")])
def test_a_link_in_the_run_being_written_is_not_written_through(hf_folders, family, name, tmp_path, monkeypatch, capsys):
    """The run is filled in a new private folder; were a link there (planted here), the copy
    and the writes would have followed it: every file of the run is created new."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    real = tempfile.mkdtemp

    def planted(*args, **kwargs):
        made = Path(real(*args, **kwargs))
        if made.parent == tmp_path:
            (made / name).symlink_to(victim)
        return str(made)

    monkeypatch.setattr(tempfile, "mkdtemp", planted)
    _refused(hf_folders(family), tmp_path / "run", capsys, f"/{name}: a symbolic link is already there in the run being "
                                                        "written; nothing is written through it")
    assert victim.read_text() == "mine"


# ---- pickled weights -----------------------------------------------------------------------------
class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_a_pickle_that_runs_code_is_refused_without_torchs_advice(hf_folders, family, tmp_path, capsys):
    """The line passed on torch's advice to load the file again with weights_only=False, which
    runs the code; it now says what the file asks for and what to do instead."""
    folder = _copy(hf_folders(family), tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({"model.shared.weight": RunsCode(marker)}, folder / "pytorch_model.bin")
    err = _refused(folder, tmp_path / "run", capsys, f"{folder / 'pytorch_model.bin'}: refused: unpickling this file "
                   "would run code or build objects (it asks for posix.system), so it is not loaded; use the model's "
                   "safetensors weights (model.safetensors) from a source you trust, or have whoever made this file "
                   "convert it to safetensors with the tool that made it")
    assert "weights_only" not in err and "\x1b" not in err and not marker.exists()


@pytest.mark.parametrize("content, says", [(b"not a pickle at all", "refused: not a file of tensors only "
                                                                      "(Unsupported operand 110), so it is not loaded"),
                                           (b"\x80\x02}q\x00(X\x01", "not a readable PyTorch weights file (unpack")])
def test_a_pytorch_model_bin_that_is_no_pickle_is_one_line(hf_folders, content, says, tmp_path, capsys):
    """(the unpickler's own errors: none passes torch's advice on)"""
    folder = _copy(hf_folders("gpt2"), tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(content)
    err = _refused(folder, tmp_path / "run", capsys, f"{folder / 'pytorch_model.bin'}: {says}")
    assert "weights_only" not in err
