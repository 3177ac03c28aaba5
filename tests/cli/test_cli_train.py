"""`transformer train` on the real Multi30k files with configs/demo.yaml (a toy model, a few
steps), then resume and translate through the CLI."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.preset=toy", "train_limit=300", "vocab_size=400", "max_tokens=512", "valid_limit=20",
        "progress=false", "threads=1", "eval_every=3", "save_every=3", "log_every=1"]


@pytest.fixture(scope="module")
def data_dir() -> Path:
    env = os.environ.get("TRANSFORMER_DATA")
    if not env or not (Path(env) / "multi30k" / "train.en.gz").is_file():
        pytest.skip("needs the Multi30k corpus: set TRANSFORMER_DATA to a folder holding multi30k/*.gz")
    return Path(env)


def test_train_resume_translate_multi30k(data_dir, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is runs/<config name>, relative to the cwd
    sets = [a for s in TINY for a in ("--set", s)]
    r = cli("train", "--config", REPO / "configs/demo.yaml", "--data-dir", data_dir, *sets, "--set", "max_steps=3")
    assert r.code == 0, r.err
    run = tmp_path / "runs" / "demo"
    assert "run directory: runs/demo" in r.out
    assert "training pairs: 300" in r.out
    for name in ("config.yaml", "subwords.model", "metrics.jsonl", "best.safetensors", "learning_curve.png",
                 "checkpoints/step-0000003/model.safetensors", "checkpoints/step-0000003/state.pt"):
        assert (run / name).is_file(), name
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["dataset"] == "multi30k" and saved["src_lang"] == "en" and saved["tgt_lang"] == "de"
    assert saved["model"] == {"preset": "toy", "dropout": 0.1}  # demo.yaml's dropout, --set's preset
    assert saved["max_steps"] == 3 and saved["data_dir"] == str(data_dir)

    r = cli("train", "--config", REPO / "configs/demo.yaml", "--data-dir", data_dir, *sets, "--set", "max_steps=4")
    assert r.code == 0, r.err
    assert "resumed from" in r.out and "(step 3)" in r.out and "stopped at step 4" in r.out
    assert (run / "checkpoints/step-0000004/model.safetensors").is_file()

    r = cli("translate", "--model", run, "--beam", 2, stdin="A man is riding a bicycle.\n\nTwo dogs play.\n")
    assert r.code == 0, r.err
    out = r.out.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""

    # the test split of the run's own dataset and languages, found through the registry
    r = cli("evaluate", "--model", run, "--split", "test_2016_flickr", "--limit", 20, "--beam", 1, "--json")
    assert r.code == 0, r.err
    scores = json.loads(r.out)
    assert scores["n_sentences"] == 20 and "nrefs:1" in scores["bleu_signature"]
    r = cli("evaluate", "--model", run, "--split", "test_2016_flickr", "--src", "x.en")
    assert r.code == 2 and "either --split or --src" in r.err
    r = cli("evaluate", "--model", run)
    assert r.code == 2 and "--split" in r.err


def test_lowercase_run_translates_and_evaluates_in_lower_case(data_dir, cli, tmp_path):
    """`--set lowercase=true`: the run's subword model lower-cases the input and the output,
    `evaluate` says so (text and JSON), and its validation BLEU uses lower-cased references."""
    sets = [a for s in TINY for a in ("--set", s)]
    run = tmp_path / "lc"
    r = cli("train", "--config", REPO / "configs/demo.yaml", "--data-dir", data_dir, "--out", run, *sets,
            "--set", "max_steps=3", "--set", "lowercase=true")
    assert r.code == 0, r.err
    assert "lower-casing" in r.out
    assert yaml.safe_load((run / "config.yaml").read_text())["lowercase"] is True

    r = cli("translate", "--model", run, "--beam", 1, stdin="A MAN IS RIDING A BICYCLE.\n")
    assert r.code == 0, r.err
    assert r.out.strip() and r.out == r.out.lower()

    r = cli("evaluate", "--model", run, "--split", "test_2016_flickr", "--limit", 5, "--beam", 1, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["lowercase_model"] is True
    r = cli("evaluate", "--model", run, "--split", "test_2016_flickr", "--limit", 5, "--beam", 1)
    assert r.code == 0, r.err
    assert "writes lower-case text" in r.out

    # Resuming the run with the other setting is refused before anything is touched.
    r = cli("train", "--config", REPO / "configs/demo.yaml", "--data-dir", data_dir, "--out", run, *sets,
            "--set", "max_steps=4")
    assert r.code != 0 and "lowercase" in r.err


@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/step-0000003", "checkpoints/new/run"])
def test_out_inside_another_runs_checkpoints_is_refused(cli, tmp_path, one_line_error, inside):
    """A new run in another run's checkpoints/: that run's checkpoints found the new config.yaml
    and vocabulary first (run files are looked up two folders up), and its keep_last pruning
    deleted a run made in a step folder. One line, before anything is made there."""
    other = tmp_path / "other"
    (other / "checkpoints" / "step-0000003").mkdir(parents=True)
    (other / "config.yaml").write_text("dataset: multi30k\n")
    before = sorted(other.rglob("*"))
    one_line_error(cli("train", "--config", REPO / "configs/demo.yaml", "--out", other / inside),
                   "train", f"--out {other / inside}", f"inside the checkpoints of the run {other}", "another --out")
    assert sorted(other.rglob("*")) == before
