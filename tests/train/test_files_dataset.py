"""dataset: files, a user's own parallel text: two aligned files or one TSV, a validation
split held out of the training pairs when no validation file is given, one-line errors for
bad files (and no run directory left behind), and configs/files-example.yaml as it stands."""
from __future__ import annotations

import pytest
import yaml

from transformer.errors import UserError
from transformer.train.train_config import load_config
from transformer.train.prepare import held_out_size, prepare_data

from own_data import REPO, TOY, file_overrides, pairs_of, quiet, write_tsv


def decoded(data) -> list[tuple[str, str]]:
    return [(data.subwords.decode(s), data.subwords.decode(t)) for s, t in data.train]


def test_one_tsv_file_reads_as_the_two_files(corpus, tmp_path):
    train = write_tsv(tmp_path / "train.tsv", pairs_of(corpus, "train"))
    valid = write_tsv(tmp_path / "valid.tsv", pairs_of(corpus, "valid"))
    tsv = prepare_data(load_config(None, ["dataset=files", f"train_src={train}", f"valid_src={valid}", *TOY]),
                       tmp_path / "tsv", 128, quiet)
    two = prepare_data(load_config(None, file_overrides(corpus)), tmp_path / "two", 128, quiet)
    assert decoded(tsv) == decoded(two) == pairs_of(corpus, "train")
    assert tsv.valid == two.valid == pairs_of(corpus, "valid")


def test_without_validation_files_a_seeded_split_is_held_out(corpus, tmp_path, log):
    cfg = load_config(None, file_overrides(corpus, valid=False) + ["valid_size=0.05"])
    data = prepare_data(cfg, tmp_path / "a", 128, log)
    assert "held out 8 of 160 training pairs for validation (valid_size 0.05, seed 1)" in log.text()
    assert "validation pairs: 8" in log.text()
    train = pairs_of(corpus, "train")
    assert len(data.valid) == 8 and len(data.train) == 152
    # a partition of the training pairs, each part in the files' order
    held = [train.index(p) for p in data.valid]
    assert held == sorted(held)
    assert decoded(data) == [p for i, p in enumerate(train) if i not in set(held)]
    # the same seed holds out the same pairs; another seed others
    assert prepare_data(cfg, tmp_path / "b", 128, quiet).valid == data.valid
    assert prepare_data(cfg.replace(seed=2), tmp_path / "c", 128, quiet).valid != data.valid


def test_valid_size_as_a_count_as_none_and_with_train_limit(corpus, tmp_path):
    cfg = load_config(None, file_overrides(corpus, valid=False) + ["valid_size=7"])
    assert len(prepare_data(cfg, tmp_path / "a", 128, quiet).valid) == 7
    assert prepare_data(cfg.replace(valid_size=0.0), tmp_path / "b", 128, quiet).valid == []
    # train_limit takes the first pairs of those left: the validation set does not move with it
    limited = prepare_data(cfg.replace(train_limit=50), tmp_path / "c", 128, quiet)
    assert len(limited.train) == 50 and limited.valid == prepare_data(cfg, tmp_path / "a", 128, quiet).valid
    # validation files given: nothing is held out
    assert len(prepare_data(load_config(None, file_overrides(corpus)), tmp_path / "d", 128, quiet).train) == 160


def test_held_out_size():
    assert held_out_size(0.01, 40) == 1  # rounded up: a small corpus still validates
    assert held_out_size(0.01, 50_000) == 500
    assert held_out_size(0.01, 10_000_000) == 1000  # a fraction is capped at 1,000 pairs
    assert held_out_size(2500.0, 10_000_000) == 2500  # a count is not
    assert held_out_size(0.0, 100) == 0


def test_holding_out_every_pair_is_refused(corpus, tmp_path):
    cfg = load_config(None, file_overrides(corpus, valid=False) + ["valid_size=160"])
    with pytest.raises(UserError, match="leaves none of the 160 to train on; lower valid_size"):
        prepare_data(cfg, tmp_path / "run", 128, quiet)


@pytest.mark.parametrize("sets,message", [
    (["valid_tgt=null"], "valid_src is given without valid_tgt"),
    (["valid_src=null"], "valid_tgt is given without valid_src"),
    (["train_tgt=null"], "valid_tgt is given but train_src is a TSV"),
    (["train_src=null"], "dataset files needs train_src"),
    (["valid_size=1.5"], "valid_size must be a whole number of pairs (>= 1) or a fraction in [0, 1), got 1.5"),
    (["valid_size=-0.1"], "valid_size"),
    (["dataset=multi30k"], "train_src, train_tgt, valid_src, valid_tgt apply to dataset files, not 'multi30k'"),
])
def test_inconsistent_file_keys_are_refused(corpus, sets, message):
    with pytest.raises(UserError) as e:
        load_config(None, file_overrides(corpus) + sets)
    assert message in str(e.value) and "\n" not in str(e.value)


def _bad_files(tmp_path, corpus) -> dict[str, dict]:
    """Config keys that point at a bad file, by case."""
    src = corpus["train_src"].read_text(encoding="utf-8").splitlines()
    (tmp_path / "short.tgt").write_text("".join(t + "\n" for _, t in pairs_of(corpus, "train")[:-2]), encoding="utf-8")
    lines = [f"{s}\t{t}" for s, t in pairs_of(corpus, "train")]
    no_tab, two_tabs = list(lines), list(lines)
    no_tab[6] = src[6]
    two_tabs[9] += "\textra"
    for name, rows in (("no_tab.tsv", no_tab), ("two_tabs.tsv", two_tabs)):
        (tmp_path / name).write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "empty.src").write_text("", encoding="utf-8")
    (tmp_path / "empty.tgt").write_text("", encoding="utf-8")
    (tmp_path / "blank.tsv").write_text("\t\n \tx\n", encoding="utf-8")
    return {
        "missing": {"train_src": str(tmp_path / "nothere.src")},
        "no-tab": {"train_src": str(tmp_path / "no_tab.tsv"), "train_tgt": None, "valid_src": None, "valid_tgt": None},
        "two-tabs": {"train_src": str(tmp_path / "two_tabs.tsv"), "train_tgt": None, "valid_src": None,
                     "valid_tgt": None},
        "line-counts": {"train_tgt": str(tmp_path / "short.tgt")},
        "valid-src-alone": {"valid_tgt": None},
        "empty-train": {"train_src": str(tmp_path / "empty.src"), "train_tgt": str(tmp_path / "empty.tgt")},
        "empty-tsv": {"train_src": str(tmp_path / "empty.src"), "train_tgt": None, "valid_src": None,
                      "valid_tgt": None},
        "blank-tsv": {"train_src": str(tmp_path / "blank.tsv"), "train_tgt": None, "valid_src": None,
                      "valid_tgt": None},
        "empty-valid": {"valid_src": str(tmp_path / "empty.src"), "valid_tgt": str(tmp_path / "empty.tgt")},
        "all-too-long": {"model": {"preset": "toy", "max_len": 2}},
        "vocab-too-large": {"vocab_size": 100000},
        "vocab-too-small": {"vocab_size": 5},
    }


@pytest.mark.parametrize("case,mentions", [
    ("missing", ["nothere.src", "not found"]),
    ("no-tab", ["no_tab.tsv:7:", "exactly one tab", "found 0"]),
    ("two-tabs", ["two_tabs.tsv:10:", "found 2"]),
    ("line-counts", ["train.src", "160 lines", "short.tgt", "158"]),
    ("valid-src-alone", ["valid_src", "valid_tgt"]),
    # an empty corpus file: named (it said "no training pairs left after skipping empty lines")
    ("empty-train", ["empty.src and ", "empty.tgt: no training pairs (both files are empty)"]),
    ("empty-tsv", ["empty.src: no training pairs (the file is empty)"]),
    ("blank-tsv", ["blank.tsv: no training pairs (each of its 2 lines is empty on one side or both)"]),
    # empty validation files: refused (the run trained without validation and said nothing)
    ("empty-valid", ["empty.src and ", "empty.tgt: no validation pairs (both files are empty)", "leave valid_src out"]),
    # every pair longer than the positions (paragraphs, not sentences): it said the data "fills fewer
    # batches of max_tokens=256 than there are ranks (1)"
    ("all-too-long", ["train.src and ", "train.tgt: every one of the 160 training pairs is too long for the model's 2 "
                      "positions", "raise model.max_len"]),
    # sentencepiece's refusals, in words: it said "INTERNAL: src/trainer_interface.cc(...)" and, for a
    # vocabulary too small for the text's characters, "try a smaller vocab_size"
    ("vocab-too-large", ["vocab_size 100000 is more subwords than this text holds (at most ", "lower vocab_size"]),
    ("vocab-too-small", ["vocab_size 5 is fewer than this text's ", "raise vocab_size to "]),
])
def test_bad_files_are_one_line_errors_and_leave_no_run(case, mentions, corpus, tmp_path, cli, one_line_error,
                                                        write_config):
    config = write_config(tmp_path / "own.yaml", **_bad_files(tmp_path, corpus)[case])
    out = tmp_path / "run"
    one_line_error(cli("train", "--config", config, "--out", out, "--set", "max_steps=2"), "train", *mentions)
    assert not out.exists()


def test_a_failed_start_in_an_existing_folder_removes_only_what_it_wrote(corpus, tmp_path, cli, write_config):
    """The vocabulary is learned, then the word vectors turn out malformed: the subword model
    and config.yaml go again; what the folder held before stays."""
    vectors = tmp_path / "bad.vec"
    vectors.write_text("dog 1 2\ncat 1\n", encoding="utf-8")
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    config = write_config(tmp_path / "own.yaml", embedding_init=str(vectors))
    r = cli("train", "--config", config, "--out", out, "--set", "max_steps=2")
    assert r.code == 2 and "bad.vec:2:" in r.err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_the_example_config_trains_as_it_stands(cli, tmp_path, monkeypatch):
    """configs/files-example.yaml from the repository root, on examples/pairs.{en,de}."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    sets = ["max_steps=2", "eval_every=2", "save_every=2", "threads=1", "progress=false"]
    r = cli("train", "--config", REPO / "configs/files-example.yaml", "--out", out,
            *[a for s in sets for a in ("--set", s)])
    assert r.code == 0, r.err
    assert "held out 1 of 40 training pairs for validation" in r.out
    assert "training pairs: 39" in r.out and "validation pairs: 1" in r.out
    assert "stopped at step 2" in r.out
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train_src"] == "examples/pairs.en" and saved["valid_size"] == 0.01
    for name in ("subwords.model", "best.safetensors", "checkpoints/step-0000002/model.safetensors"):
        assert (out / name).is_file(), name
    r = cli("translate", "--model", out, "--beam", 1, stdin="A man is riding a bicycle.\n")
    assert r.code == 0 and len(r.out.splitlines()) == 1, r.err


def test_a_files_run_older_than_valid_size_resumes_as_it_was(corpus, tmp_path):
    """A run made before valid_size existed validated on nothing when it had no validation
    files; resumed under today's default (1% held out) its training data would change, so
    that resume is refused until valid_size: 0 says what the run did."""
    from transformer.train.trainer import Trainer

    run = tmp_path / "run"
    overrides = file_overrides(corpus, valid=False) + ["max_steps=2", "save_every=1"]
    Trainer(load_config(None, overrides + ["valid_size=0"]), run, log=quiet).train()
    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    del saved["valid_size"]  # as an older version wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    with pytest.raises(UserError, match="valid_size"):
        Trainer(load_config(None, overrides + ["max_steps=3"]), run, log=quiet)
    assert Trainer(load_config(None, overrides + ["max_steps=3", "valid_size=0"]), run, log=quiet).step == 2


@pytest.mark.parametrize("sets", [["valid_size=0"], ["valid_size=1", "eval_bleu=false"]])
def test_a_run_without_validation_bleu_does_not_report_one(corpus, tmp_path, sets):
    """No validation pairs, or no BLEU computed on them: the last line said "best validation
    BLEU 0.00", a score nothing had measured."""
    from transformer.train.trainer import Trainer

    lines: list[str] = []
    overrides = file_overrides(corpus, valid=False) + ["max_steps=2", "eval_every=1", *sets]
    Trainer(load_config(None, overrides), tmp_path / "run", log=lines.append).train()
    assert lines[-1].startswith("stopped at step 2 (max_steps); ") and lines[-1].endswith(" no validation BLEU")


@pytest.mark.parametrize("vocab_size,words", [(100000, "lower vocab_size to "), (5, "raise vocab_size to ")])
def test_the_vocabulary_size_sentencepiece_suggests_trains(corpus, tmp_path, vocab_size, words, cli, write_config):
    """The size the refusal names is one the text allows: the largest, or the smallest."""
    config = write_config(tmp_path / "own.yaml", vocab_size=vocab_size)
    result = cli("train", "--config", config, "--out", tmp_path / "run", "--set", "max_steps=1")
    assert result.code == 2 and words in result.err
    size = int(result.err.split(words)[1].split()[0])
    cfg = load_config(None, [*file_overrides(corpus), f"vocab_size={size}", "max_steps=1"])
    assert prepare_data(cfg, tmp_path / "ok", log=quiet).subwords.vocab_size == size
