"""Every script under benchmarks/ answers ``--help`` (found by glob: a new script is covered
without listing it), without the optional packages that only its measurements need, and
records the machine it ran on (transformer.hardware) in its output and in any JSON it writes."""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: modules that other scripts import, with no command line of their own
HELPERS = {
    "peak_memory.py": "peak_rss_mib() for child processes; imports nothing heavy (not even torch) on purpose",
    "turns.py": "its_turn(), the context manager of the side-by-side races",
}
#: what --help must not import: optional peers and tools that only a measurement needs
HEAVY = {"ctranslate2", "transformers", "playwright", "gensim", "onnxruntime", "model"}  # model: nanoGPT's
SCRIPTS = sorted(p for p in BENCHMARKS.rglob("*.py") if p.relative_to(BENCHMARKS).as_posix() not in HELPERS)
IDS = [p.relative_to(BENCHMARKS).as_posix() for p in SCRIPTS]


def _help(script: Path) -> subprocess.CompletedProcess:
    # -X importtime: every module imported is listed on stderr, so the heavy ones can be seen
    return subprocess.run([sys.executable, "-X", "importtime", str(script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=BENCHMARKS.parent, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def helps():
    """Each script's --help, two at a time (each is one interpreter start and its imports)."""
    with ThreadPoolExecutor(2) as pool:
        futures = {script: pool.submit(_help, script) for script in SCRIPTS}
        yield futures
        for f in futures.values():
            f.cancel()


def test_the_helpers_left_out_exist_and_the_glob_finds_scripts():
    assert all((BENCHMARKS / name).is_file() for name in HELPERS), "a helper listed here is gone: update HELPERS"
    assert len(SCRIPTS) >= 20 and BENCHMARKS / "gpu_base.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_help(helps, script):
    r = helps[script].result()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout.lower(), r.stdout
    imported = {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s*\d+ \|\s*\d+ \|\s*(\S+)", r.stderr, re.M)}
    assert not imported & HEAVY, f"--help imported {sorted(imported & HEAVY)}: import them where they are used"


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_records_the_machine(script):
    """It prints describe_line() when it starts, and any JSON it writes has describe()."""
    text = script.read_text(encoding="utf-8")
    assert "hardware.describe_line()" in text, "print transformer.hardware.describe_line() at the start"
    if "json.dump" in text:  # results (and, in some, a child's message)
        assert "hardware.describe()" in text, 'write "machine": transformer.hardware.describe() into the JSON'
