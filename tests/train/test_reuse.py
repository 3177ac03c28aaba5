"""Starting a run from earlier work: init_from (fine-tuning), subwords_from, embedding_init.
What each takes, what a new run directory holds, that resume never re-applies them, and the
one-line refusals of every mismatch (exit 2, no traceback, no run directory left)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from transformer.data import Subwords, train_subwords
from transformer.errors import UserError
from transformer.run import resolve_weights
from transformer.run.weights import read_weights, unique_state_dict
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer

from own_data import file_overrides, quiet
from tiny_corpus import SRC_WORDS, TGT_OF


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in unique_state_dict(model).items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def error_of(cli, config, out, *sets) -> object:
    return cli("train", "--config", config, "--out", out, *[a for s in sets for a in ("--set", s)])


# ---- init_from: fine-tuning --------------------------------------------------------------

def test_a_fine_tune_starts_from_the_source_weights(source_run, make_cfg, tmp_path, log):
    trainer = Trainer(make_cfg("max_steps=2", f"init_from={source_run}"), tmp_path / "ft", log=log)
    _, source, _ = read_weights(resolve_weights(source_run))
    assert same(unique_state_dict(trainer.model), source)
    assert trainer.step == 0 and not trainer.optimizer.state  # a fresh optimizer and schedule
    assert f"init_from: the weights of {resolve_weights(source_run)}" in log.text()
    run = tmp_path / "ft"
    assert (run / "subwords.model").read_bytes() == (source_run / "subwords.model").read_bytes()
    assert yaml.safe_load((run / "config.yaml").read_text())["init_from"] == str(source_run)
    assert "learned a joint BPE" not in log.text()
    trainer.train()
    assert not same(load_file(str(run / "checkpoints/step-0000002/model.safetensors")), source)  # it trained


def test_init_from_a_checkpoint(source_run, make_cfg, tmp_path):
    ckpt = source_run / "checkpoints" / "step-0000002"
    trainer = Trainer(make_cfg("max_steps=1", f"init_from={ckpt}"), tmp_path / "ft", log=quiet)
    assert same(unique_state_dict(trainer.model), load_file(str(ckpt / "model.safetensors")))


def test_without_a_model_section_the_source_architecture_is_taken(source_run, write_config, tmp_path):
    config = write_config(tmp_path / "ft.yaml", model=None, init_from=str(source_run))
    cfg = load_config(config, ["model.dropout=0.2", "model.max_len=64"])
    assert cfg.model == {"dropout": 0.2, "max_len": 64}
    trainer = Trainer(cfg.replace(max_steps=1), tmp_path / "ft", log=quiet)
    source_cfg = read_weights(resolve_weights(source_run))[0]
    assert source_cfg.d_model == 64  # the toy preset, not the default tiny's 128
    assert trainer.model.cfg == source_cfg.replace(dropout=0.2, max_len=64)
    assert load_config(config).model == {}


def test_resuming_a_fine_tune_is_exact_and_needs_the_source_no_more(source_run, make_cfg, tmp_path):
    sets = ("model.dropout=0.1", "save_every=2", "keep_last=10")
    straight = tmp_path / "straight"
    Trainer(make_cfg(*sets, "max_steps=4", f"init_from={source_run}"), straight, log=quiet).train()

    source = copy_run(source_run, tmp_path / "source")
    half = tmp_path / "half"
    Trainer(make_cfg(*sets, "max_steps=2", f"init_from={source}"), half, log=quiet).train()
    shutil.rmtree(source)  # resume reads the checkpoint, not init_from
    cfg = make_cfg(*sets, "max_steps=4", f"init_from={source}")
    trainer = Trainer(cfg, half, log=quiet)
    assert trainer.step == 2
    assert same(unique_state_dict(trainer.model), load_file(str(half / "checkpoints/step-0000002/model.safetensors")))
    trainer.train()
    step4 = "checkpoints/step-0000004/model.safetensors"
    assert same(load_file(str(straight / step4)), load_file(str(half / step4)))


@pytest.mark.parametrize("sets,mentions", [
    (["model.d_ff=256"], ["model.d_ff is 256", "d_ff 128"]),
    (["model.preset=tiny"], ["model.preset 'tiny' has d_model 128", "d_model 64"]),
    (["lowercase=true"], ["init_from", "keeps case", "lowercase: false"]),
    (["embedding_init=v.txt"], ["init_from and embedding_init"]),
])
def test_a_conflicting_fine_tune_is_refused(source_run, write_config, cli, one_line_error, tmp_path, sets, mentions):
    config = write_config(tmp_path / "ft.yaml", init_from=str(source_run))
    out = tmp_path / "ft"
    one_line_error(error_of(cli, config, out, *sets), "train", *mentions)
    assert not out.exists()


def test_init_from_that_is_no_model(write_config, cli, one_line_error, tmp_path, source_run):
    for where, mentions in ((tmp_path / "nothing", ["init_from:", "nothing", "no such model"]),
                            (tmp_path / "empty", ["init_from:", "empty", "no weights found"])):
        (tmp_path / "empty").mkdir(exist_ok=True)
        out = tmp_path / "ft"
        one_line_error(error_of(cli, write_config(tmp_path / "ft.yaml", init_from=str(where)), out), "train", *mentions)
        assert not out.exists()
    # weights moved away from their subword model
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(resolve_weights(source_run), alone / "w.safetensors")
    r = error_of(cli, write_config(tmp_path / "ft.yaml", init_from=str(alone / "w.safetensors")), tmp_path / "ft")
    one_line_error(r, "train", "init_from:", "no subwords.model")


def test_weights_beside_another_vocabulary_are_refused(source_run, corpus, write_config, cli, one_line_error,
                                                       tmp_path):
    run = copy_run(source_run, tmp_path / "mixed")
    other = train_subwords(corpus["train_tgt"].read_text().splitlines(), tmp_path / "other", vocab_size=90)
    shutil.copy(other.path, run / "subwords.model")
    config = write_config(tmp_path / "ft.yaml", init_from=str(run / "best.safetensors"), vocab_size=90)
    one_line_error(error_of(cli, config, tmp_path / "ft"), "train", "init_from:", "embedding rows for 120",
                   "holds 90")
    # a checkpoint's weights name the subword model they were trained with
    config = write_config(tmp_path / "ft.yaml", init_from=str(run / "checkpoints/step-0000004"))
    one_line_error(error_of(cli, config, tmp_path / "ft"), "train", "init_from:", "another subword model")
    assert not (tmp_path / "ft").exists()


@pytest.mark.parametrize("option", ["subwords_from", "embedding_init"])
def test_a_language_model_does_not_take_them(tmp_path, option):
    """(init_from it does take: tests/train/test_init_from_text.py)"""
    text = tmp_path / "t.txt"
    text.write_text("some text\n" * 50)
    with pytest.raises(UserError, match=f"{option} apply to translation"):
        load_config(None, ["dataset=text", f"text_files={text}", "model.preset=nanogpt-char", f"{option}=x"])


# ---- subwords_from ---------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["run", "file"])
def test_subwords_from_copies_the_model_in(source_run, make_cfg, tmp_path, log, what):
    given = source_run if what == "run" else source_run / "subwords.model"
    trainer = Trainer(make_cfg("max_steps=1", f"subwords_from={given}"), tmp_path / "run", log=log)
    assert (tmp_path / "run/subwords.model").read_bytes() == (source_run / "subwords.model").read_bytes()
    assert "reusing the subword model" in log.text() and "learned a joint BPE" not in log.text()
    # a new model: not the source's weights
    assert not same(unique_state_dict(trainer.model), read_weights(resolve_weights(source_run))[1])


def test_a_reused_vocabulary_keeps_its_own_size(corpus, make_cfg, tmp_path):
    """vocab_size sizes a vocabulary to learn; a reused one (90 pieces, config 120) is taken as it is."""
    texts = corpus["train_src"].read_text().splitlines()
    small = train_subwords(texts, tmp_path / "v90", vocab_size=90)
    trainer = Trainer(make_cfg("max_steps=1", f"subwords_from={small.path}"), tmp_path / "run", log=quiet)
    assert trainer.model.cfg.vocab_size == 90 == Subwords.load(tmp_path / "run/subwords.model").vocab_size


def test_subwords_from_and_init_from_may_name_the_same_model(source_run, make_cfg, tmp_path):
    Trainer(make_cfg("max_steps=1", f"init_from={source_run}", f"subwords_from={source_run}/subwords.model"),
            tmp_path / "run", log=quiet)


@pytest.mark.parametrize("case,mentions", [
    ("lowercase", ["subwords_from:", "lower-cases", "lowercase: false", "lowercase: true"]),
    ("other-than-init-from", ["subwords_from", "init_from", "different subword models"]),
    ("missing", ["subwords_from:", "nothere.model", "no such file"]),
    ("not-a-model", ["subwords_from:", "junk.model", "not a valid sentencepiece model"]),
])
def test_a_mismatched_vocabulary_is_refused(case, mentions, source_run, corpus, write_config, cli, one_line_error,
                                            tmp_path):
    texts = corpus["train_src"].read_text().splitlines()
    keys = {
        "lowercase": lambda: {"subwords_from": str(train_subwords(texts, tmp_path / "lc", vocab_size=120,
                                                                  lowercase=True).path)},
        "other-than-init-from": lambda: {"init_from": str(source_run), "subwords_from": str(
            train_subwords(texts, tmp_path / "o", vocab_size=120).path)},
        "missing": lambda: {"subwords_from": str(tmp_path / "nothere.model")},
        "not-a-model": lambda: {"subwords_from": str(_junk(tmp_path / "junk.model"))},
    }[case]()
    out = tmp_path / "run"
    one_line_error(error_of(cli, write_config(tmp_path / "c.yaml", **keys), out), "train", *mentions)
    assert not out.exists()


def _junk(path: Path) -> Path:
    path.write_bytes(b"not a model\n")
    return path


# ---- embedding_init ---------------------------------------------------------------------------

def write_vectors(path: Path, dim: int = 8) -> Path:
    """GloVe lines for the corpus's source words and half of its target words."""
    gen = torch.Generator().manual_seed(5)
    words = list(SRC_WORDS) + sorted(TGT_OF.values())[::2]
    path.write_text("".join(f"{w} {' '.join(f'{x:.4f}' for x in torch.randn(dim, generator=gen).tolist())}\n"
                            for w in words), encoding="utf-8")
    return path


VECTOR_WORDS = set(SRC_WORDS) | set(sorted(TGT_OF.values())[::2])


def found_rows(sw) -> list[int]:
    """The ids of the pieces write_vectors gives a vector (every piece here is lower-case)."""
    return [i for i in range(sw.vocab_size) if sw.is_normal(i) and sw.id_to_piece(i).removeprefix("\u2581")
            in VECTOR_WORDS]


def test_embedding_init_sets_the_found_rows_of_a_new_run_only(make_cfg, tmp_path, log):
    vectors = write_vectors(tmp_path / "v.txt")
    plain = Trainer(make_cfg("max_steps=2", "save_every=1"), tmp_path / "plain", log=quiet)
    cfg = make_cfg("max_steps=2", "save_every=1", f"embedding_init={vectors}")
    trainer = Trainer(cfg, tmp_path / "run", log=log)
    line = next(x for x in log if x.startswith("embedding_init: "))
    sw = trainer.data.subwords
    found = found_rows(sw)
    total = sum(sw.is_normal(i) for i in range(sw.vocab_size))
    assert len(found) > 10
    assert line.startswith(f"embedding_init: {len(found)} of {total} pieces found ({100 * len(found) / total:.1f}%)")
    assert "the shared embedding; 8-dim vectors mapped orthogonally to 64 dimensions" in line
    a, b = unique_state_dict(plain.model), unique_state_dict(trainer.model)
    emb = "src_embed.weight"
    others = [i for i in range(sw.vocab_size) if i not in found]
    assert same({k: v for k, v in a.items() if k != emb}, {k: v for k, v in b.items() if k != emb})
    assert torch.equal(a[emb][others], b[emb][others])  # the same seed: the same random rows
    assert not (a[emb][found] == b[emb][found]).all(dim=1).any()
    trainer.train()

    log.clear()  # resumed: the checkpoint's embeddings, not the vectors again
    resumed = Trainer(cfg.replace(max_steps=3), tmp_path / "run", log=log)
    assert not any(x.startswith("embedding_init") for x in log)
    assert same(unique_state_dict(resumed.model),
                load_file(str(tmp_path / "run/checkpoints/step-0000002/model.safetensors")))


def test_untied_embeddings_both_start_from_the_vectors(make_cfg, tmp_path, log):
    cfg = make_cfg("model.tie_embeddings=false", f"embedding_init={write_vectors(tmp_path / 'v.txt', dim=100)}")
    trainer = Trainer(cfg.replace(max_steps=1), tmp_path / "run", log=log)
    assert "the source and target embeddings; 100-dim vectors reduced to their 64 principal directions" in log.text()
    found, model = found_rows(trainer.data.subwords), trainer.model
    src, tgt = model.src_embed.weight.detach()[found], model.tgt_embed.weight.detach()[found]
    torch.testing.assert_close(src / src.norm(), tgt / tgt.norm())  # the same rows, each table's own scale


@pytest.mark.parametrize("content,mentions", [
    ("dog 1 2 3\ncat 1 2\n", ["embedding_init:", "v.txt:2:", "2 numbers, expected 3"]),
    ("2 3\ndog 1 2 3\n", ["embedding_init:", "v.txt", "says 2 vectors but the file holds 1"]),
    ("emu 1 2 3\ngnu 1 2 3\n", ["embedding_init:", "none of the", "pieces of the subword model"]),
    (None, ["embedding_init:", "v.txt", "not found"]),
])
def test_bad_word_vectors_are_refused(content, mentions, write_config, cli, one_line_error, tmp_path):
    vectors = tmp_path / "v.txt"
    if content is not None:
        vectors.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    one_line_error(error_of(cli, write_config(tmp_path / "c.yaml", embedding_init=str(vectors)), out, "max_steps=1"),
                   "train", *mentions)
    assert not out.exists()
