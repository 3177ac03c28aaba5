"""The Makefile's plan, read with `make -n` (the commands printed, none run) on a copy of the
Makefile: which torch build a new .venv gets (TORCH, or the machine when it is unset), and what
`make run` and `make test` install."""
from __future__ import annotations

import os
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


def machine(tmp_path: Path, gpu: bool) -> dict:
    """The environment of a machine with or without an NVIDIA GPU: an nvidia-smi first on PATH
    that lists one GPU, or fails as it does where no driver is loaded."""
    bin_dir = tmp_path / ("gpu-bin" if gpu else "cpu-bin")
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n" if gpu else
                   "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH", "MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def make_n(folder: Path, target: str, *argv: str, gpu: bool = False, env: dict | None = None):
    env = dict(env or machine(folder.parent, gpu))
    return subprocess.run(["make", "-n", target, *argv], cwd=folder, capture_output=True, text=True,
                          timeout=60, env=env)


def pip_lines(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [" ".join(x.split()) for x in done.stdout.splitlines() if "pip install" in x]


def torch_line(done) -> str:
    (line,) = [x for x in pip_lines(done) if "torch==" in x]
    return line


def test_without_a_gpu_run_installs_the_cpu_build_and_no_extra(checkout):
    """make run on a machine without an NVIDIA GPU: PyTorch's CPU build (PyPI's wheel only when
    that index does not answer within seconds), the project without its test extras."""
    lines = pip_lines(make_n(checkout, "run"))
    torch = torch_line(make_n(checkout, "run"))
    assert torch.startswith(f".venv/bin/pip install --quiet --timeout 10 --retries 0 torch==2.13.0 {CPU_INDEX} ")
    assert "cannot be reached; installing PyPI's torch==2.13.0 instead" in torch
    assert ".venv/bin/pip install --quiet -e ." in lines
    assert not [x for x in lines if "[" in x or "nvidia" in x.lower()], lines
    assert "torch>=2.13,<2.14" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # 2.13.0 is admitted


def test_with_a_gpu_the_cuda_build(checkout):
    assert torch_line(make_n(checkout, "run", gpu=True)) == ".venv/bin/pip install --quiet torch==2.13.0 && echo cuda > .venv/.torch"


def test_make_test_adds_the_test_extras(checkout):
    lines = pip_lines(make_n(checkout, "test"))
    assert lines[-1] == ".venv/bin/pip install --quiet -e '.[test]'"
    assert "bash .ci/install-browser.sh" in make_n(checkout, "test").stdout


@pytest.mark.parametrize("argv, line", [
    (("TORCH=cpu",), f".venv/bin/pip install --quiet torch==2.13.0 {CPU_INDEX} && echo cpu > .venv/.torch"),
    (("TORCH=cuda",), ".venv/bin/pip install --quiet torch==2.13.0 && echo cuda > .venv/.torch")])
def test_torch_asked_for(checkout, argv, line):
    for gpu in (False, True):  # what is asked for wins over the machine
        assert torch_line(make_n(checkout, "setup", *argv, gpu=gpu)) == line


def test_an_unknown_build_is_refused(checkout):
    done = make_n(checkout, "setup", "TORCH=rocm")
    assert done.returncode != 0 and "TORCH=rocm: give auto, cpu or cuda" in done.stderr


def test_a_venv_of_another_build_is_not_silently_kept(checkout):
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".torch").write_text("cpu\n")
    (checkout / ".venv" / ".installed").touch()
    done = make_n(checkout, "setup", "TORCH=cuda")
    assert done.returncode != 0
    assert ".venv holds the TORCH=cpu build; remove .venv (rm -rf .venv) to install TORCH=cuda" in done.stderr
    from_env = machine(checkout.parent, gpu=False) | {"TORCH": "cuda"}  # TORCH=cuda make setup
    assert make_n(checkout, "setup", env=from_env).returncode != 0
    for same in ("TORCH=cpu", "TORCH=auto", None):  # the build it has, or none asked for: nothing to do
        for gpu in (False, True):
            done = make_n(checkout, "setup", *([same] if same else []), gpu=gpu)
            assert done.returncode == 0 and "pip install" not in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("recorded", ["", "default\n"])
def test_a_venv_made_before_the_torch_file_holds_pypis_wheel(checkout, recorded):
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".installed").write_text(recorded)
    assert make_n(checkout, "setup", "TORCH=cuda").returncode == 0
    done = make_n(checkout, "setup", "TORCH=cpu")
    assert done.returncode != 0 and ".venv holds the TORCH=cuda build" in done.stderr
