"""evaluate --output never replaces what the command reads: the --src or --ref file, or a
file the --model run keeps; nor does translate --output a file of the run. They wrote the
translations over any of them (the source file gone, or the run's config.yaml holding
hypotheses), after a successful decoding."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def copies(trained, tmp_path):
    """The run and its validation files, copied (the test tries to overwrite them)."""
    run = shutil.copytree(trained.run, tmp_path / "run")
    src = shutil.copyfile(trained.corpus["valid_src"], tmp_path / "valid.src")
    ref = shutil.copyfile(trained.corpus["valid_tgt"], tmp_path / "valid.ref")
    return run, src, ref


@pytest.mark.parametrize("target,mention", [
    ("src", "is the --src file"),
    ("ref", "is the --ref file"),
    ("run/config.yaml", "is a file of the run"),
    ("run/subwords.model", "is a file of the run"),
    ("run/best.safetensors", "is a file of the run"),
    ("run/checkpoints/step-0000300/model.safetensors", "is a file of the run"),
])
def test_output_over_an_input_is_refused_and_nothing_changes(cli, one_line_error, copies, tmp_path, target, mention):
    run, src, ref = copies
    out = {"src": src, "ref": ref}.get(target, tmp_path / target)
    before = {p: p.read_bytes() for p in [src, ref, *run.rglob("*")] if p.is_file()}
    result = cli("evaluate", "--model", run, "--src", src, "--ref", ref, "--beam", "1", "--output", out)
    one_line_error(result, "evaluate", f"--output {out}", mention, "give another file")
    assert {p: p.read_bytes() for p in before} == before


def test_output_beside_the_run_files_is_written(cli, copies, tmp_path):
    run, src, ref = copies
    result = cli("evaluate", "--model", run, "--src", src, "--ref", ref, "--beam", "1", "--output", run / "valid.hyp")
    assert result.code == 0, result.err
    assert len((run / "valid.hyp").read_text(encoding="utf-8").splitlines()) == len(src.read_text().splitlines())


@pytest.mark.parametrize("target,mention", [
    ("run/config.yaml", "is a file of the run"),
    ("run/best.safetensors", "is a file of the run"),
])
def test_translate_output_over_a_run_file_is_refused(cli, one_line_error, copies, tmp_path, target, mention):
    """translate --output naming a file of the run replaced it with the translations once they
    were complete (translating a file in place, --output naming the --input, is allowed:
    test_cli_translate.test_output_may_overwrite_the_input)."""
    run, src, _ = copies
    out = tmp_path / target
    before = {p: p.read_bytes() for p in [src, *run.rglob("*")] if p.is_file()}
    result = cli("translate", "--model", run, "--input", src, "--beam", "1", "--output", out)
    one_line_error(result, "translate", f"--output {out}", mention, "give another file")
    assert {p: p.read_bytes() for p in before} == before


def test_output_through_a_link_writes_its_target(cli, copies, tmp_path):
    """evaluate --output through a symbolic link writes the link's target and keeps the link
    (renaming a finished file over it replaced the link), as translate --output does."""
    run, src, ref = copies
    target, link = tmp_path / "hyps" / "valid.hyp", tmp_path / "latest.hyp"
    target.parent.mkdir()
    target.write_text("old\n", encoding="utf-8")
    link.symlink_to(target)
    result = cli("evaluate", "--model", run, "--src", src, "--ref", ref, "--beam", "1", "--output", link)
    assert result.code == 0, result.err
    assert link.is_symlink() and link.resolve() == target
    assert len(target.read_text(encoding="utf-8").splitlines()) == len(src.read_text(encoding="utf-8").splitlines())
