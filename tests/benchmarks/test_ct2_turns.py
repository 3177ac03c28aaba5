"""The decoding and generation benchmarks hold a CTranslate2 model only for its own timed turn
(a live one slows every torch system in the process: benchmarks/lm/README.md), and
benchmarks/lm/neighbour.py, which measures that, runs end to end."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Turn:
    """A system with open / close that records what happened, and fails on request."""

    def __init__(self, fail: bool = False):
        self.events, self.fail, self.is_open = [], fail, False

    def open(self):
        self.events.append("open")
        self.is_open = True

    def close(self):
        self.events.append("close")
        self.is_open = False

    def __call__(self, srcs, beam, forced):
        assert self.is_open, "decoded while not open"
        self.events.append("decode")
        if self.fail:
            raise RuntimeError("boom")
        return [list(s) for s in srcs]


def test_decode_job_opens_before_and_closes_after_even_on_failure():
    run = load(REPO / "benchmarks" / "decode" / "run.py")
    turn = Turn()
    seconds, outs = run.job(turn, [[5, 6], [7]], 1, 4, None)
    assert outs == [[5, 6], [7]] and seconds >= 0
    assert turn.events == ["open", "decode", "decode", "close"]
    failing = Turn(fail=True)
    with pytest.raises(RuntimeError):
        run.job(failing, [[5]], 1, 4, None)
    assert failing.events == ["open", "decode", "close"]


def test_ct2_system_holds_no_translator_outside_its_turn():
    run = load(REPO / "benchmarks" / "decode" / "run.py")
    system = run.ct2(Path("unused"), ["<pad>", "a"], "float32", 1)
    assert system.translator is None
    system.translator = object()  # as open() leaves it
    system.close()
    assert system.translator is None


def test_neighbour_runs_and_reports_every_system():
    pytest.importorskip("ctranslate2")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lm" / "neighbour.py"), "--new", "4",
                        "--rounds", "1", "--threads", "1", "--no-gemm-timing"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = re.findall(r"^\| (ours-fp32|ours-fp32-compiled|hf-fp32) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+)x \|$",
                      r.stdout, flags=re.M)
    assert [row[0] for row in rows] == ["ours-fp32", "ours-fp32-compiled", "hf-fp32"]
    assert all(float(row[3]) > 0 for row in rows)
