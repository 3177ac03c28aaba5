"""Fine-tuning a language model (``init_from`` on dataset text): the new run starts from the
source's weights and architecture, encodes its own text with the source's tokenizer (the
files copied in, nothing learned), trains, resumes exactly, and refuses what does not fit in
one line (exit 2)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from transformer.data.text import WindowSampler, load_tokenizer, split_text, windows
from transformer.run import resolve_weights
from transformer.run.weights import read_weights, unique_state_dict
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer

torch.set_num_threads(1)

WORDS = "the a cat dog sat ran on under mat log and then quickly slowly".split()
TOY = ["model.preset=nanogpt-char", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1",
       "model.max_len=16"]
TRAINING = ["batch_size=4", "optimizer=adamw", "lr_schedule=cosine", "peak_lr=0.01", "warmup=2", "precision=fp32",
            "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000"]


def make_text(n_lines: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + ".\n" for _ in range(n_lines))


def quiet(*args) -> None:
    return None


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in unique_state_dict(model).items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module", params=["chars", "bpe"])
def source(request, tmp_path_factory) -> Path:
    """A toy language-model run (characters, or a 60-piece BPE), trained for 6 updates."""
    root = tmp_path_factory.mktemp(f"source-{request.param}")
    (root / "a.txt").write_text(make_text(120, seed=0), encoding="utf-8")
    cfg = load_config(None, ["dataset=text", f"text_files=[{root / 'a.txt'}]", f"tokenizer={request.param}",
                             "vocab_size=60", *TOY, *TRAINING, "max_steps=6", "save_every=6"])
    Trainer(cfg, root / "run", log=quiet).train()
    return root / "run"


@pytest.fixture
def user_text(tmp_path) -> Path:
    path = tmp_path / "mine.txt"
    path.write_text(make_text(60, seed=7), encoding="utf-8")
    return path


def finetune(source: Path, text: Path, *overrides: str):
    """A fine-tune's config: no model section, no tokenizer; the user's text and init_from."""
    return load_config(None, ["dataset=text", f"text_files=[{text}]", f"init_from={source}", *TRAINING,
                              *overrides])


def test_a_fine_tune_starts_from_the_source_and_keeps_its_tokenizer(source, user_text, tmp_path):
    lines = []
    run = tmp_path / "ft"
    trainer = Trainer(finetune(source, user_text, "max_steps=3"), run, log=lambda *a: lines.append(" ".join(a)))
    source_cfg, source_weights, _ = read_weights(resolve_weights(source))
    assert trainer.model.cfg == source_cfg  # the source's architecture, not the default preset's
    assert same(state(trainer.model), source_weights)
    assert trainer.step == 0 and not trainer.optimizer.state  # a fresh optimizer and schedule
    # the tokenizer: the source's files, byte for byte; none learned
    copied = sorted(p.name for p in run.iterdir() if p.name in ("chars.json", "subwords.model", "subwords.vocab"))
    assert copied == sorted(p.name for p in source.iterdir() if p.name in copied + ["chars.json", "subwords.model",
                                                                                      "subwords.vocab"])
    assert copied and all((run / n).read_bytes() == (source / n).read_bytes() for n in copied)
    assert not any("learned" in line or "distinct characters" in line for line in lines), lines
    assert trainer.data.tokenizer.encode("the cat") == load_tokenizer(source).encode("the cat")
    train_text, _ = split_text(user_text.read_text(encoding="utf-8"), 0.1)
    assert trainer.data.train.tolist() == load_tokenizer(source).encode(train_text)  # the user's text

    # the first update's loss is the source model's loss on the first batch
    model = trainer.task.build_model()
    model.load_state_dict(source_weights, strict=False)
    model.eval()
    context = trainer.task.context
    batch = windows(trainer.data.train, WindowSampler(len(trainer.data.train), context, 4, 1).next_starts(), context)
    with torch.no_grad():
        expected = F.cross_entropy(model(batch.x).flatten(0, 1), batch.y.flatten()).item()
    trainer.train()
    first = next(r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("step") == 1)
    assert first["loss"] == pytest.approx(expected, rel=1e-5)
    _, tuned, _ = read_weights(resolve_weights(run))
    assert not same(tuned, source_weights)  # it trained


def test_explain_training_reads_a_fine_tune(source, user_text, tmp_path):
    """explain --training rebuilds a fine-tune's model from its source's architecture (the
    run's config has no model section), and its loss is that of the run's first batch."""
    from transformer.viz.walkthrough_training import explain_update

    run = tmp_path / "ft"
    Trainer(finetune(source, user_text, "max_steps=2"), run, log=quiet).train()
    numbers = explain_update(run, lr=1e-3).numbers
    assert numbers["loss"] > 0 and numbers["scored_tokens"] > 0


def test_resuming_a_fine_tune_is_exact(source, user_text, tmp_path):
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    Trainer(finetune(source, user_text, "max_steps=4", "save_every=2"), straight, log=quiet).train()
    Trainer(finetune(source, user_text, "max_steps=2", "save_every=2"), halves, log=quiet).train()
    Trainer(finetune(source, user_text, "max_steps=4", "save_every=2"), halves, log=quiet).train()
    a = read_weights(straight / "checkpoints/step-0000004/model.safetensors")[1]
    b = read_weights(halves / "checkpoints/step-0000004/model.safetensors")[1]
    assert same(a, b)


def test_the_example_config_loads():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "finetune-text.yaml")
    assert cfg.is_language_model and cfg.init_from and cfg.model == {}


@pytest.mark.parametrize("sets, mentions", [
    (["model.d_model=64"], ["model.d_model is 64", "d_model 32", "leave the model section out"]),
    (["model.preset=llama-char"], ["model.preset 'llama-char'", "init_from"]),
    (["model.max_len=32"], ["model.max_len is 32", "max_len 16", "dropout, attn_dropout"]),  # learned positions: a table
    (["context=17"], ["context 17", "max_len 16"]),
    (["subwords_from=x.model"], ["subwords_from", "translation"]),
])
def test_what_does_not_fit_the_source_is_one_line(cli, one_line_error, source, user_text, tmp_path, sets,
                                                  mentions):
    config = tmp_path / "ft.yaml"
    config.write_text(f"dataset: text\ntext_files: [{user_text}]\ninit_from: {source}\nprogress: false\n")
    r = cli("train", "--config", config, "--out", tmp_path / "ft", *[a for s in sets for a in ("--set", s)])
    one_line_error(r, "train", *mentions)
    assert not (tmp_path / "ft").exists()


def test_a_character_the_source_never_saw_is_one_line(cli, one_line_error, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.txt").write_text(make_text(120, seed=0), encoding="utf-8")
    cfg = load_config(None, ["dataset=text", f"text_files=[{root / 'a.txt'}]", "tokenizer=chars", *TOY, *TRAINING,
                             "max_steps=1"])
    Trainer(cfg, root / "run", log=quiet).train()
    (tmp_path / "greek.txt").write_text(make_text(60, seed=1) + "a λόγος\n", encoding="utf-8")
    config = tmp_path / "ft.yaml"
    config.write_text(f"dataset: text\ntext_files: [{root / 'a.txt'}, {tmp_path / 'greek.txt'}]\n"
                      f"init_from: {root / 'run'}\n")
    r = cli("train", "--config", config, "--out", tmp_path / "ft")
    # the file, line and column of the first character the source lacks (it named only the new run's
    # copy of chars.json, removed as the failed start is undone)
    one_line_error(r, "train", f"{tmp_path / 'greek.txt'}:61: character 'λ' (U+03BB) at column 3 is not one of the ",
                   f"characters of init_from {root / 'run'} (its chars.json)", "replace or remove it")
    assert not (tmp_path / "ft").exists()


def test_a_translation_source_is_one_line(cli, one_line_error, user_text, tmp_path):
    from transformer import ModelConfig, Transformer
    from transformer.run.weights import save_weights

    mt = tmp_path / "mt.safetensors"
    save_weights(Transformer(ModelConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=1)), mt)
    config = tmp_path / "ft.yaml"
    config.write_text(f"dataset: text\ntext_files: [{user_text}]\ninit_from: {mt}\n")
    r = cli("train", "--config", config, "--out", tmp_path / "ft")
    one_line_error(r, "train", "init_from", "translation model", "decoder-only")


def test_a_run_nested_in_another_kind_of_run_reads_its_own_tokenizer(source, user_text, tmp_path):
    """A run directory inside a folder that holds another tokenizer (a character run's
    chars.json two levels up, as runs/char/bpe/ nests): generate, evaluate and init_from
    read the run's own tokenizer, not the folder's above it."""
    import shutil

    from transformer.data.chars import Chars
    from transformer.train.reuse import tokenizer_files

    outer = tmp_path / "outer"
    Chars.learn("xyz").save(outer / "chars.json")
    run = outer / "runs" / "lm"
    shutil.copytree(source, run)
    own = load_tokenizer(source)
    for path in (run, run / "best.safetensors", *sorted((run / "checkpoints").iterdir())):
        assert type(load_tokenizer(path)) is type(own) and load_tokenizer(path).vocab_size == own.vocab_size
    main = "chars.json" if (source / "chars.json").is_file() else "subwords.model"
    assert tokenizer_files(run)[main].parent == run
    Trainer(finetune(run, user_text, "max_steps=1"), tmp_path / "ft", log=quiet).train()
    assert (tmp_path / "ft" / main).read_bytes() == (source / main).read_bytes()
