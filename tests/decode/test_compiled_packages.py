"""Where compiled decoding steps live (compiled/__init__.py, compiled/build.py, compiled/packages.py):
a package is named by a digest of what it was built from, so a changed model never loads a
stale one; a run keeps one package per kind of search in its folder of the user's cache,
with the SHA-256 its build recorded, found by later processes; a damaged package is built
again, a folder that cannot be written is left alone, and an interrupted build leaves
nothing behind. (The packages' tokens against eager decoding: test_search_compiled.py,
tests/lm/test_generate_compiled.py, tests/cli/test_cli_decoding.py; packages that are not
the user's own: tests/faults/test_package_trust.py.)"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from transformer import compiled
from transformer.compiled import build, packages
from transformer.decode.precision import for_inference


def test_a_package_name_follows_the_weights_the_search_and_the_precision(make_model):
    model = make_model()
    name = build.package_name(model, 4, True)
    assert name.startswith("search-beam4-float32-") and name.endswith(".pt2")
    assert build.package_name(copy.deepcopy(model), 4, True) == name  # the same weights, another object
    assert build.package_name(model, 1, True).startswith("search-greedy-float32-")
    assert build.package_name(for_inference(model, "bf16"), 4, True).startswith("search-beam4-bfloat16-")
    assert build.package_name(for_inference(model, "int8"), 4, True).startswith("search-beam4-int8-")
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-3
    assert build.package_name(model, 4, True) != name
    model.train()
    assert build.package_name(model.eval(), 4, True) != build.package_name(model.train(), 4, True)


def test_a_run_keeps_one_package_per_kind_and_later_models_load_it(make_model, tmp_path, fake_builds):
    folder = tmp_path / "compiled"
    model = make_model()
    compiled.keep_in(model, folder)
    assert not compiled.is_built(model, 4)
    compiled.step(model, 4).prepare()
    compiled.step(model, 1).prepare()
    assert [p.name.rsplit("-", 1)[0] for p in fake_builds] == ["search-beam4-float32", "search-greedy-float32"]
    assert compiled.is_built(model, 4) and sorted(folder.iterdir()) == with_digests(fake_builds)
    # another process (another model object, the same weights) finds them
    again = copy.deepcopy(model)
    compiled.keep_in(again, folder)
    assert compiled.is_built(again, 4)
    compiled.step(again, 4).prepare()
    assert len(fake_builds) == 2
    # new weights: a new beam package replaces the old one; the greedy one stays until it is needed
    with torch.no_grad():
        next(again.parameters())[0, 0] += 1e-3
    assert not compiled.is_built(again, 4)
    compiled.step(again, 4).prepare()
    assert len(fake_builds) == 3
    assert sorted(folder.iterdir()) == with_digests([fake_builds[2], fake_builds[1]])


def with_digests(paths: list[Path]) -> list[Path]:
    """Packages and the SHA-256 files their builds recorded beside them, sorted."""
    return sorted([*paths, *(p.with_name(p.name + ".sha256") for p in paths)])


def test_a_model_without_a_folder_builds_for_the_process(make_model, fake_builds):
    model = make_model()
    assert not compiled.is_built(model, 1)
    compiled.step(model, 1).prepare()
    assert compiled.is_built(model, 1)  # (in memory)
    assert fake_builds[0].parent.name.startswith("transformer-steps-")


def test_a_damaged_package_is_built_again(make_model, tmp_path, fake_builds):
    folder = tmp_path / "compiled"
    model = make_model()
    compiled.keep_in(model, folder)
    path = folder / build.package_name(model, 1, True)
    folder.mkdir()
    path.write_bytes(b"half a package")
    packages.record(path)  # (its build recorded it: only loading it fails)
    with pytest.warns(UserWarning, match=r"cannot be loaded \(RuntimeError: not a package\); deleted, building it "
                                         "again"):
        compiled.step(model, 1).prepare()
    assert fake_builds == [path] and path.read_bytes() == b"package"
    assert packages.check(path) is None  # the new package's digest recorded


def test_a_folder_that_cannot_be_written_is_left_alone(make_model, tmp_path, fake_builds, monkeypatch):
    folder = tmp_path / "compiled"
    folder.mkdir()
    monkeypatch.setattr(packages.os, "access", lambda path, mode: False)
    model = make_model(seed=7)  # (weights of its own: no package of this process's has them)
    compiled.keep_in(model, folder)
    with pytest.warns(UserWarning, match="not writable; compiled decoding steps are kept in a temporary folder"):
        compiled.step(model, 1).prepare()
    assert list(folder.iterdir()) == [] and fake_builds[0].parent == packages.scratch()


def test_an_interrupted_build_leaves_nothing_behind(make_model, tmp_path, monkeypatch):
    def interrupted(program, package_path, inductor_configs):
        Path(package_path).write_bytes(b"half a package")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build.build(make_model(), 1, True, tmp_path / "step.pt2")
    assert list(tmp_path.iterdir()) == []


def test_a_translator_decodes_large_batches_eagerly(make_model, monkeypatch):
    """The front door decides with the batch it will decode: the compiled step saves a step's
    fixed costs, and beyond MAX_COMPILED_ROWS rows eager was as fast."""
    from transformer.inference import front_door
    from transformer.inference import translator as translator_module
    from transformer.compiled.search_step import CompiledStep
    from transformer.decode import beam
    from transformer.decode.decoding_config import DecodingConfig

    seen = []
    monkeypatch.setattr(beam, "decode_beams", lambda step, *a: seen.append(isinstance(step, CompiledStep)) or [])
    translator = translator_module.Translator(make_model(), None, DecodingConfig(beam=4, compile="on"))
    rows = front_door.MAX_COMPILED_ROWS // 4
    for sentences in (1, rows, rows + 1):
        translator._decode(torch.full((sentences, 3), 5), 1)
    assert seen == [True, True, False]
    assert translator.compiles() == (True, True) and translator.compiles(rows * 4 + 4) == (False, False)
    translator = translator.with_decoding(compile="off")
    translator._decode(torch.full((1, 3), 5), 1)
    assert seen[-1] is False
