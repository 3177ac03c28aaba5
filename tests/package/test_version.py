"""``transformer --version`` and the one place the version is written."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import transformer

ROOT = Path(__file__).resolve().parents[2]


def test_version_option_prints_the_package_version(cli):
    r = cli("--version")
    assert r.code == 0 and r.err == ""
    assert r.out == f"transformer {transformer.__version__}\n"
    assert re.fullmatch(r"transformer \d+\.\d+\.\d+\n", r.out)


def test_version_in_a_real_process():
    done = subprocess.run([sys.executable, "-m", "transformer", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"transformer {transformer.__version__}\n", "")


def test_package_metadata_takes_the_version_from_the_package():
    """pyproject.toml does not repeat the version: setuptools reads transformer.__version__."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "transformer.__version__"}
