"""docs/config.md is generated from the config classes by tools/gen_config_doc.py: it must
be what the generator writes now, and every key of every config must have a meaning."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from transformer.model.config import ModelConfig
from transformer.decode.decoding_config import DecodingConfig
from transformer.errors import UserError
from transformer.serve.serve_config import ServeConfig
from transformer.train.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
CLASSES = (TrainConfig, ModelConfig, DecodingConfig, ServeConfig)


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return load_module(ROOT / "tools" / "gen_config_doc.py", "gen_config_doc")


@pytest.fixture(scope="module")
def page(gen) -> str:
    return gen.render()


def test_docs_config_md_is_what_the_generator_writes_now(page):
    doc = ROOT / "docs" / "config.md"
    current = doc.read_text(encoding="utf-8") if doc.is_file() else ""
    assert current == page, "docs/config.md is out of date: regenerate it with `python tools/gen_config_doc.py`"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_key_of_every_config_has_a_meaning(gen, cls):
    keys = gen.class_keys(cls)  # raises, naming file:line, for a key without one
    assert [k.name for k in keys] == [f.name for f in dataclasses.fields(cls)]
    assert all(k.meaning.strip() for k in keys)


def test_every_key_is_on_the_page_once(page):
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in page, f"{cls.__name__}.{f.name} is missing from docs/config.md"


def test_the_page_marks_exactly_the_resumable_training_keys(page):
    training = page.split("## Training keys")[1].split("## Model keys")[0]
    marked = set(re.findall(r"^\| `(\w+)` \|.*\| may change \|", training, flags=re.M))
    assert marked == TrainConfig.resumable_fields()
    assert {"patience", "max_steps", "decoding"} <= marked and "seed" not in marked


def test_training_keys_are_grouped_by_the_class_sections(gen, page):
    groups = {k.name: k.group for k in gen.class_keys(TrainConfig)}
    assert groups["src_lang"] == "data" and groups["clip_norm"] == "optimisation"
    assert groups["patience"] == "evaluation and checkpoints" and groups["warmup"] == "schedule and limits"
    assert groups["log_every"] == "logging" and groups["model"].startswith("model")
    assert page.index("### Data") < page.index("`src_lang`") < page.index("### Optimisation") \
        < page.index("`clip_norm`") < page.index("### Schedule") < page.index("`warmup`") \
        < page.index("### Evaluation") < page.index("### Logging")


def test_every_default_shown_reads_back_as_that_default(gen):
    """A user can copy a default into a YAML config: 1e-5 shown as 1e-05 would read as a string."""
    for cls in CLASSES:
        for key in gen.class_keys(cls):
            if key.default is not gen.REQUIRED:
                assert yaml.safe_load(gen.yaml_value(key.default)) == key.default, (cls.__name__, key.name)
    assert gen.yaml_value(1e-5) == "1.0e-5" and gen.yaml_value({"preset": "tiny"}) == "{preset: tiny}"


def test_presets_table_lists_every_preset_with_its_shape(page):
    from transformer.model.config import PRESETS

    for name, preset in PRESETS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[3:7] == [str(preset[k]) for k in ("d_model", "n_heads", "n_layers", "d_ff")], name
    assert "| `tiny` |" in page and "| 2.3M |" in page  # tiny: 2,349,056 parameters with 8,000 tokens


def test_decoding_and_service_flags_come_from_the_commands(page):
    assert "| `beam` | `--beam` (translate, evaluate, attention, explain, serve) |" in page
    assert "| `temperature` | `--temperature` (generate, explain, serve) |" in page
    assert "| `max_len_a` |  |" in page  # no flag: the decoding: section only
    assert "| `batching` | `--no-batching` |" in page and "| `max_body_bytes` |  |" in page


def write_module(tmp_path: Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return load_module(path, name)


def test_a_key_without_a_meaning_is_an_error_naming_its_line(gen, tmp_path):
    module = write_module(tmp_path, "config_doc_probe_a", """\
        from dataclasses import dataclass

        @dataclass
        class Probe:
            # ---- first ----
            a: int = 1  # the first key
            # ---- second ----
            b: str = "x"
        """)
    with pytest.raises(UserError, match=r"config_doc_probe_a\.py:8: Probe\.b has no meaning"):
        gen.class_keys(module.Probe)


def test_meanings_come_from_comments_else_the_docstring_args(gen, tmp_path):
    module = write_module(tmp_path, "config_doc_probe_b", '''\
        from dataclasses import dataclass, field

        @dataclass
        class Probe:
            """A probe.

            Args:
                a: from the docstring,
                    over two lines.
                b: not used: the comment wins.
            """

            # ---- first ----
            a: int = 1
            b: list[int] = field(default_factory=lambda: [1, 2])  # from the comment
        ''')
    keys = {k.name: k for k in gen.class_keys(module.Probe)}
    assert keys["a"].meaning == "from the docstring, over two lines"
    assert keys["b"].meaning == "from the comment" and keys["b"].default == [1, 2]
    assert keys["a"].group == keys["b"].group == "first"


def test_check_fails_on_a_stale_page_and_writing_makes_it_current(gen, page, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "render", lambda: page)  # rendered once for the module
    out = tmp_path / "config.md"
    assert gen.main(["--check", "--out", str(out)]) == 1  # missing
    out.write_text(page.replace("beam size", "beam width"), encoding="utf-8")
    assert gen.main(["--check", "--out", str(out)]) == 1
    assert "out of date; regenerate it with `python tools/gen_config_doc.py`" in capsys.readouterr().err
    assert gen.main(["--out", str(out)]) == 0 and out.read_text(encoding="utf-8") == page
    assert gen.main(["--check", "--out", str(out)]) == 0
    assert not [p for p in tmp_path.iterdir() if p.name != "config.md"]  # no temporary file left


def test_an_unwritable_page_is_a_one_line_error(gen, page, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "render", lambda: page)
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert gen.main(["--out", str(tmp_path / "file" / "config.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gen_config_doc: error: ") and "cannot write" in err and err.count("\n") == 1
