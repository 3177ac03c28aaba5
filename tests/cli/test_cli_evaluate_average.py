"""`transformer evaluate` (sacreBLEU / chrF with signatures, --json) and
`transformer average` (the mean of the last K checkpoints)."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

from transformer.evaluation.translation import tokenized_lc_bleu
from transformer.inference.translator import load_translator


@pytest.fixture(scope="module")
def expected(trained):
    """The translations of the validation set and their sacreBLEU scores, computed directly."""
    src = trained.corpus["valid_src"].read_text(encoding="utf-8").splitlines()
    ref = trained.corpus["valid_tgt"].read_text(encoding="utf-8").splitlines()
    hyps = load_translator(trained.run, beam=4).translate(src)
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    return {
        "hyps": hyps,
        "bleu": bleu.corpus_score(hyps, [ref]).score,
        "chrf": chrf.corpus_score(hyps, [ref]).score,
        "bleu_lc": sacrebleu.BLEU(lowercase=True).corpus_score(hyps, [ref]).score,
        "bleu_tok_lc": tokenized_lc_bleu(hyps, ref, "de")[0],  # tgt_lang of the run's config
        "bleu_signature": str(bleu.get_signature()),  # nrefs:1|case:mixed|eff:no|tok:13a|...
        "chrf_signature": str(chrf.get_signature()),
    }


def test_evaluate_prints_scores_with_signature(trained, cli, expected):
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"], "--ref", trained.corpus["valid_tgt"])
    assert r.code == 0, r.err
    assert expected["bleu"] > 1  # the toy model learned something; the score is not trivially 0
    assert f"BLEU {expected['bleu']:.2f}" in r.out
    assert f"chrF {expected['chrf']:.2f}" in r.out
    assert expected["bleu_signature"] in r.out and "case:mixed" in r.out and "tok:13a" in r.out
    assert "20 sentences" in r.out and "beam 4" in r.out
    assert "lower-case text" not in r.out  # the note is for lower-casing models only


def test_evaluate_json(trained, cli, expected, tmp_path):
    out = tmp_path / "hyps.txt"
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"],
            "--ref", trained.corpus["valid_tgt"], "--json", "--output", out)
    assert r.code == 0, r.err
    data = json.loads(r.out)  # stdout is exactly one JSON document
    assert data["bleu"] == pytest.approx(expected["bleu"])
    assert data["chrf"] == pytest.approx(expected["chrf"])
    assert data["bleu_lc"] == pytest.approx(expected["bleu_lc"])
    assert data["bleu_tok_lc"] == pytest.approx(expected["bleu_tok_lc"])
    assert data["tok_lc_signature"].startswith("moses-lc:de|")
    assert data["bleu_signature"] == expected["bleu_signature"]
    assert data["chrf_signature"] == expected["chrf_signature"]
    assert data["n_sentences"] == 20 and data["beam"] == 4 and data["lowercase_model"] is False
    assert out.read_text(encoding="utf-8").splitlines() == expected["hyps"]


def test_evaluate_an_ensemble(trained, cli):
    """`evaluate --model A B` scores the ensemble's translations and names both models."""
    models = [str(p) for p in sorted((trained.run / "checkpoints").iterdir())[-2:]]
    r = cli("evaluate", "--model", *models, "--src", trained.corpus["valid_src"],
            "--ref", trained.corpus["valid_tgt"], "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["model"] == models and data["n_sentences"] == 20
    src = trained.corpus["valid_src"].read_text(encoding="utf-8").splitlines()
    ref = trained.corpus["valid_tgt"].read_text(encoding="utf-8").splitlines()
    hyps = load_translator(models, beam=4).translate(src)
    assert data["bleu"] == pytest.approx(sacrebleu.BLEU().corpus_score(hyps, [ref]).score)


def test_evaluate_gzip_and_perfect_score(trained, cli, tmp_path, expected):
    """Gzipped inputs work, and scoring the system's own output as reference gives 100."""
    src, ref = tmp_path / "src.gz", tmp_path / "ref.gz"
    src.write_bytes(gzip.compress(trained.corpus["valid_src"].read_bytes()))
    ref.write_bytes(gzip.compress("".join(h + "\n" for h in expected["hyps"]).encode()))
    r = cli("evaluate", "--model", trained.run, "--src", src, "--ref", ref, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["bleu"] == pytest.approx(100.0)


def test_evaluate_mismatched_line_counts(trained, cli, tmp_path, one_line_error):
    ref = tmp_path / "short.ref"
    ref.write_text("".join(trained.corpus["valid_tgt"].read_text().splitlines(keepends=True)[:-2]))
    out = tmp_path / "out.txt"
    r = cli("evaluate", "--model", trained.run, "--src", trained.corpus["valid_src"], "--ref", ref, "--output", out)
    one_line_error(r, "evaluate", trained.corpus["valid_src"], ref, "20", "18")
    assert not out.exists()


# ---- average ----------------------------------------------------------------------------

@pytest.fixture
def run_copy(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained.run, dst)
    return dst


def test_average_last_two(run_copy, cli):
    r = cli("average", "--model", run_copy, "--last", 2)
    assert r.code == 0, r.err
    out = run_copy / "averaged.safetensors"
    assert out.is_file() and "averaged 2 checkpoints" in r.out and str(out) in r.out
    one = cli("average", "--model", run_copy, "--last", 1, "--out", run_copy / "one.safetensors")
    assert one.code == 0 and "averaged 1 checkpoint (step-0000" in one.out, one.err
    avg = load_file(str(out))
    a = load_file(str(run_copy / "checkpoints/step-0000200/model.safetensors"))
    b = load_file(str(run_copy / "checkpoints/step-0000300/model.safetensors"))
    for k in avg:
        torch.testing.assert_close(avg[k], (a[k].double() + b[k].double()).div(2).float())
    # translate now uses the averaged weights and still works
    r = cli("translate", "--model", run_copy, stdin="red dog runs\n")
    assert r.code == 0 and r.out.strip()


def test_average_more_than_available_and_out(run_copy, cli, tmp_path):
    out = tmp_path / "elsewhere" / "avg.safetensors"
    r = cli("average", "--model", run_copy, "--last", 10, "--out", out)
    assert r.code == 0, r.err
    assert "averaged 3 checkpoints" in r.out and "step-0000100" in r.out and out.is_file()
    assert not (run_copy / "averaged.safetensors").exists()


def test_average_out_outside_the_run_decodes_on_its_own(run_copy, cli, tmp_path):
    """Weights alone do not translate (the vocabulary lives in the run): --out elsewhere gets
    the run's config.yaml and vocabulary beside it, and decodes as the same average in the run."""
    out = tmp_path / "elsewhere" / "avg.safetensors"
    r = cli("average", "--model", run_copy, "--last", 2, "--out", out)
    assert r.code == 0, r.err
    assert len(r.out.splitlines()) == 1 and f"decode with --model {out}" in r.out
    for name in ("config.yaml", "subwords.model", "subwords.vocab"):
        assert (out.parent / name).read_bytes() == (run_copy / name).read_bytes(), name
    assert cli("average", "--model", run_copy, "--last", 2).code == 0  # the same average, in the run
    src = "red dog runs\nthe cat\n"
    ours = cli("translate", "--model", out, stdin=src)
    assert ours.code == 0, ours.err
    assert ours.out == cli("translate", "--model", run_copy / "averaged.safetensors", stdin=src).out
    assert ours.out.strip()
    # a second average into the same folder finds the same files there: accepted, nothing copied
    again = cli("average", "--model", run_copy, "--last", 3, "--out", out.parent / "avg3.safetensors")
    assert again.code == 0 and "copied" not in again.out, again.err
    assert cli("translate", "--model", out.parent / "avg3.safetensors", stdin=src).code == 0


def test_average_out_a_folder_makes_a_run_folder(run_copy, cli, tmp_path):
    folder = tmp_path / "averaged"
    folder.mkdir()
    r = cli("average", "--model", run_copy, "--last", 2, "--out", folder)
    assert r.code == 0, r.err
    assert (folder / "averaged.safetensors").is_file() and (folder / "subwords.model").is_file()
    t = cli("translate", "--model", folder, stdin="red dog runs\n")
    assert t.code == 0 and t.out.strip(), t.err


def test_average_out_inside_the_run_copies_nothing(run_copy, cli):
    out = run_copy / "averages" / "avg.safetensors"
    r = cli("average", "--model", run_copy, "--last", 2, "--out", out)
    assert r.code == 0 and "decode with" not in r.out, r.err
    assert sorted(p.name for p in out.parent.iterdir()) == ["avg.safetensors"]
    assert cli("translate", "--model", out, stdin="red dog runs\n").code == 0


@pytest.mark.parametrize("where", ["beside", "above"])
def test_average_out_where_another_runs_vocabulary_would_be_read_is_refused(run_copy, cli, tmp_path,
                                                                              one_line_error, where):
    """A folder holding another vocabulary (there, or up where a decoder also looks): the
    weights would decode with it. One line naming the file; nothing written."""
    folder = tmp_path / "other"
    stranger = folder / "subwords.model" if where == "beside" else folder / "chars.json"
    folder.mkdir()
    stranger.write_bytes(b"another run's vocabulary")
    out = folder / "avg.safetensors" if where == "beside" else folder / "sub" / "avg.safetensors"
    one_line_error(cli("average", "--model", run_copy, "--last", 2, "--out", out), "average", stranger, "--out")
    assert sorted(p.name for p in folder.rglob("*")) == [stranger.name]


def test_average_copies_every_file_decoding_reads():
    """The names average copies beside --out cover every tokenizer file a run can hold."""
    from transformer.data.chars import CHARS_FILE
    from transformer.data.marian_tokenizer import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, TOKENIZER_CONFIG, VOCAB
    from transformer.run import CONFIG, DECODING_FILES
    from transformer.train.prepare import TOKENIZER_FILES

    needed = {CONFIG, CHARS_FILE, *TOKENIZER_FILES, SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG}
    assert needed <= set(DECODING_FILES), needed - set(DECODING_FILES)


@pytest.mark.parametrize("last", ["0", "-1"])
def test_average_last_must_be_positive(run_copy, cli, one_line_error, last):
    one_line_error(cli("average", "--model", run_copy, "--last", last), "average", "--last")
    assert not (run_copy / "averaged.safetensors").exists()


def test_average_without_checkpoints(cli, tmp_path, one_line_error):
    one_line_error(cli("average", "--model", tmp_path), "average", str(tmp_path), "no checkpoints")


def test_average_out_under_a_file_is_one_line(run_copy, cli, tmp_path, one_line_error):
    """--out notes.txt/avg.safetensors: the copy of config.yaml failed, and removing the
    copies it had not made ended in a NotADirectoryError traceback."""
    (tmp_path / "notes.txt").write_text("mine")
    one_line_error(cli("average", "--model", run_copy, "--out", tmp_path / "notes.txt" / "avg.safetensors"),
                   "average", f"({tmp_path / 'notes.txt'} is a file, not a folder)")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["config.yaml", "subwords.model", "best.safetensors", "metrics.jsonl",
                                  "checkpoints/step-0000300/model.safetensors"])
def test_average_out_naming_a_file_of_the_run_is_refused(run_copy, cli, one_line_error, name):
    """--out RUN/config.yaml wrote the weights over the run's config (and likewise its
    vocabulary, best weights or a checkpoint): one line, the file left as it was."""
    before = (run_copy / name).read_bytes()
    one_line_error(cli("average", "--model", run_copy, "--last", 2, "--out", run_copy / name), "average", "--out",
                   name, "averaged.safetensors")
    assert (run_copy / name).read_bytes() == before
    # an earlier average may be replaced
    assert cli("average", "--model", run_copy, "--last", 2, "--out", run_copy / "averaged.safetensors").code == 0
    assert cli("average", "--model", run_copy, "--last", 3, "--out", run_copy / "averaged.safetensors").code == 0


def test_average_out_a_new_folder_with_a_slash(run_copy, cli, tmp_path):
    """--out new/ (a folder not made yet) wrote a weights file named "new" and the run's
    config and vocabulary loose beside it; it is made as a folder holding averaged.safetensors."""
    folder = tmp_path / "made"
    r = cli("average", "--model", run_copy, "--last", 2, "--out", f"{folder}/")
    assert r.code == 0, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made", "run"]
    assert {"averaged.safetensors", "config.yaml", "subwords.model"} <= {p.name for p in folder.iterdir()}
    assert cli("translate", "--model", folder, stdin="red dog runs\n").code == 0
