"""The run layout's two file helpers that training and inference share (run/layout.py): a YAML
file read with a one-line error naming it, and a file or folder removed; and the trainer's uses."""
from __future__ import annotations

import pytest

from alias_bombs import alias_bomb, alias_list

from transformer.errors import UserError
from transformer.run.layout import read_run_config, read_yaml, remove


def test_read_yaml_gives_the_document(tmp_path):
    f = tmp_path / "settings.yaml"
    f.write_text("beam: 4\nalpha: 0.6\n", encoding="utf-8")
    assert read_yaml(f, "fix it") == {"beam": 4, "alpha": 0.6}
    f.write_text("", encoding="utf-8")
    assert read_yaml(f, "fix it") is None


@pytest.mark.parametrize("content", [b"tgt_lang: [de\n", b"\xff\xfe not UTF-8\n"], ids=["bad-yaml", "not-utf8"])
def test_unreadable_yaml_is_one_line_naming_the_file_and_the_remedy(tmp_path, content):
    f = tmp_path / "config.yaml"
    f.write_bytes(content)
    with pytest.raises(UserError) as caught:
        read_yaml(f, "restore it")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{f}: not readable YAML (") and message.endswith("); restore it")


def test_read_run_config(tmp_path):
    assert read_run_config(tmp_path) == {}  # no config.yaml
    (tmp_path / "config.yaml").write_text("- not a mapping\n", encoding="utf-8")
    assert read_run_config(tmp_path) == {}
    (tmp_path / "config.yaml").write_text("tgt_lang: de\n", encoding="utf-8")
    assert read_run_config(tmp_path) == {"tgt_lang": "de"}
    (tmp_path / "config.yaml").write_text("tgt_lang: [de\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"config\.yaml: not readable YAML .*give the options it would have supplied"):
        read_run_config(tmp_path)


def test_remove_takes_a_file_a_folder_or_nothing(tmp_path):
    (tmp_path / "file").write_text("x", encoding="utf-8")
    (tmp_path / "folder" / "inside").mkdir(parents=True)
    (tmp_path / "folder" / "inside" / "file").write_text("y", encoding="utf-8")
    for name in ("file", "folder", "never-there"):
        remove(tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_a_run_whose_config_is_unreadable_is_refused_in_one_line(tmp_path):
    """Resuming: the trainer reads the run's config.yaml with read_yaml and its own remedy."""
    from transformer.train.train_config import TrainConfig
    from transformer.train.run_dir import check_run_dir

    checkpoint = tmp_path / "checkpoints" / "step-0000001"
    checkpoint.mkdir(parents=True)
    for name in ("model.safetensors", "state.pt"):  # a complete checkpoint: the folder holds a run
        (checkpoint / name).write_bytes(b"")
    (tmp_path / "config.yaml").write_text("max_steps: [3\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"config\.yaml: not readable YAML \(.*\); restore it or use another --out$"):
        check_run_dir(tmp_path, TrainConfig())


def test_a_failed_first_attempt_removes_what_it_wrote(tmp_path):
    from transformer.train.run_dir import undone_if_it_fails

    run = tmp_path / "run"
    run.mkdir()
    (run / "kept.txt").write_text("before", encoding="utf-8")
    with pytest.raises(RuntimeError), undone_if_it_fails(run, active=True):
        (run / "subwords.model").write_text("new", encoding="utf-8")
        (run / "checkpoints" / ".step-0000001.tmp").mkdir(parents=True)
        raise RuntimeError("bad input")
    assert [p.name for p in run.iterdir()] == ["kept.txt"]


@pytest.mark.parametrize("text,key,line,first", [
    ("max_steps: 100\npeak_lr: 0.001\nmax_steps: 200\n", "max_steps", 3, 1),
    ("model:\n  d_model: 8\n  n_heads: 2\n  d_model: 16\n", "d_model", 4, 2),
    ("decoding: {beam: 4, beam: 5}\n", "beam", 1, 1),
])
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path, text, key, line, first):
    """safe_load keeps the last value and says nothing: the first one was silently ignored."""
    f = tmp_path / "config.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_yaml(f, "fix it")
    assert str(caught.value) == (f"{f}: line {line}: key {key!r} appears twice in one mapping (first on line {first}), "
                                 "and only the last would count; keep one")


def test_the_same_key_in_different_mappings_and_a_merge_override_are_fine(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text("a: {x: 1}\nb: {x: 2}\nbase: &base {beam: 4, alpha: 0.6}\ndecoding:\n  <<: *base\n  beam: 5\n"
                 "1: one\n'1': also one\n", encoding="utf-8")
    assert read_yaml(f, "fix it") == {"a": {"x": 1}, "b": {"x": 2}, "base": {"beam": 4, "alpha": 0.6},
                                      "decoding": {"beam": 5, "alpha": 0.6}, 1: "one", "1": "also one"}


def test_translation_tokenizer_is_the_nearest_folders(tmp_path):
    """A run trained inside a folder that holds a Marian import's source.spm reads its own
    subwords.model (and a Marian run nested under a trained run its own source.spm)."""
    from transformer.inference.translator import tokenizer_files

    outer = tmp_path / "opus"
    (outer / "mine" / "checkpoints" / "step-5").mkdir(parents=True)
    for name in ("source.spm", "target.spm", "vocab.json"):
        (outer / name).write_bytes(b"x")
    (outer / "mine" / "subwords.model").write_bytes(b"x")
    assert tokenizer_files(outer / "mine") == [outer / "mine" / "subwords.model"]
    assert tokenizer_files(outer / "mine" / "checkpoints" / "step-5") == [outer / "mine" / "subwords.model"]
    assert tokenizer_files(outer) == [outer / n for n in ("source.spm", "target.spm", "vocab.json")]
    (outer / "mine" / "opus2").mkdir()
    for name in ("source.spm", "target.spm", "vocab.json"):
        (outer / "mine" / "opus2" / name).write_bytes(b"x")
    assert tokenizer_files(outer / "mine" / "opus2")[0] == outer / "mine" / "opus2" / "source.spm"


def test_aliases_that_expand_too_far_are_refused_before_anything_is_built(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text(alias_bomb(), encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_yaml(f, "restore it")
    assert str(caught.value) == (f"{f}: not readable YAML (line 1, column 1: its aliases (*name) repeat more than "
                                 "100,000 values; write the values out instead); restore it")
    f.write_text(alias_bomb(levels=3), encoding="utf-8")  # 729 values: a config may use aliases
    assert len(read_yaml(f, "restore it")["decoding"]["alpha"]) == 9


@pytest.mark.parametrize("text,says", [
    ("a: &a [1, *a]\n", "an alias refers to its own anchor"),
    ("decoding: {alpha: " + "[" * 5_000 + "]" * 5_000 + "}\n", "nested too deeply"),
], ids=["recursive-alias", "deep-nesting"])
def test_endless_or_too_deep_yaml_is_one_line(tmp_path, text, says):
    f = tmp_path / "config.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_yaml(f, "restore it")
    message = str(caught.value)
    assert message.startswith(f"{f}: not readable YAML (") and says in message and "\n" not in message


def test_a_config_file_over_a_mebibyte_is_not_parsed(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_bytes(b"# padding\n" * (2**20 // 10 + 1))
    with pytest.raises(UserError) as caught:
        read_yaml(f, "restore it")
    assert str(caught.value) == f"{f}: larger than 1 MiB, which no config is (a config is a few kilobytes); restore it"


def test_a_set_value_of_aliases_stays_the_text_given():
    """--set values are read as YAML too (train_config._parse_value): a bomb there is text."""
    from transformer.train.train_config import _parse_value

    assert _parse_value(alias_list()) == alias_list()
    assert _parse_value("[&a [1, 2], *a]") == [[1, 2], [1, 2]]


def test_a_value_in_an_error_is_cut_to_a_few_dozen_characters():
    from transformer.decode.decoding_config import DecodingConfig
    from transformer.errors import shown

    nested = [["x" * 1000] * 9] * 9
    with pytest.raises(ValueError) as caught:
        DecodingConfig(alpha=nested)
    assert str(caught.value) == f"alpha must be a number, got {shown(nested)}" and len(str(caught.value)) < 90
    assert shown("beam") == "'beam'" and shown([1, 2]) == "[1, 2]"
