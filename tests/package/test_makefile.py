"""The Makefile's TORCH variable: which torch build `make setup` (and so `make run` and
`make test`) installs into a new .venv, checked with `make -n` (the commands printed, none
run) on a copy of the Makefile."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


@pytest.fixture
def checkout(tmp_path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def make_n(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "setup", *argv], cwd=folder, capture_output=True, text=True, timeout=60)


def torch_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if re.search(r"pip install .*torch==", x)]
    return " ".join(line.split())


@pytest.mark.parametrize("argv, index", [((), ""), (("TORCH=default",), ""), (("TORCH=cuda",), ""),
                                          (("TORCH=cpu",), CPU_INDEX)])
def test_torch_picks_the_wheel(checkout, argv, index):
    """default and cuda: the plain PyPI wheel, as before TORCH existed (CI's machines cannot
    reach PyTorch's index); cpu: PyTorch's CPU-only build."""
    line = torch_line(make_n(checkout, *argv))
    assert line == f".venv/bin/pip install --quiet torch==2.13.0 {index}".strip()
    assert "torch>=2.13,<2.14" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # 2.13.0 is admitted


def test_an_unknown_build_is_refused(checkout):
    done = make_n(checkout, "TORCH=rocm")
    assert done.returncode != 0 and "TORCH=rocm: give default, cpu or cuda" in done.stderr


def test_a_venv_of_another_build_is_not_silently_kept(checkout):
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".installed").write_text("cpu\n")
    done = make_n(checkout, "TORCH=cuda")
    assert done.returncode != 0
    assert ".venv holds the TORCH=cpu build; remove .venv (rm -rf .venv) to install TORCH=cuda" in done.stderr
    for same in ("TORCH=cpu", None):  # the build it has, or none asked for: nothing to do
        done = make_n(checkout, *([same] if same else []))
        assert done.returncode == 0 and "pip install" not in done.stdout, done.stdout + done.stderr
    (checkout / ".venv" / ".installed").write_text("")  # a .venv made before TORCH: the default wheel
    assert make_n(checkout, "TORCH=cuda").returncode == 0  # the same PyPI wheel as default
    assert make_n(checkout, "TORCH=cpu").returncode != 0
