"""`transformer translate` on inputs of any length: read and translated chunk by chunk, the
output in input order and the same for every chunk size, stdout flushed per chunk, an
--output file written only when complete, a progress bar only on a terminal (and for
`transformer evaluate` too)."""
from __future__ import annotations

import json
import os
import queue
import random
import select
import subprocess
import sys
import threading

import pytest

from transformer.inference.translator import Translator, load_translator

LINES = [
    "red dog runs", "the big cat sits under the tree", "a woman plays with a ball near the house",
    "small bird", "the man sees a green car", "child eats", "blue water near the park",
    "a cat and a dog", "big tree", "the woman runs with the child in the street", "green ball", "man sits",
]


@pytest.fixture(scope="module")
def mixed() -> list[str]:
    """LINES twice, shuffled, with empty and blank lines in between (and one at the end)."""
    lines = LINES * 2 + ["", "   ", "\t", ""]
    random.Random(0).shuffle(lines)
    return lines + [""]


@pytest.fixture(scope="module")
def translator(trained) -> Translator:
    return load_translator(trained.run, beam=4)


@pytest.fixture
def in_file(tmp_path, mixed):
    path = tmp_path / "in.txt"
    path.write_text("".join(line + "\n" for line in mixed), encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_every_chunk_size_gives_the_whole_input_translation(trained, cli, translator, mixed, in_file, chunk):
    expected = translator.translate(mixed)
    assert len(set(expected)) > len(LINES) // 2  # input-dependent output, not one constant line
    r = cli("translate", "--model", trained.run, "--input", in_file, "--chunk-lines", chunk, "--max-tokens", 12)
    assert r.code == 0, r.err
    assert r.out.split("\n") == expected + [""]
    assert r.err == ""  # stderr is no terminal here: no progress bar


@pytest.mark.parametrize("chunk", [2, 1000])
def test_n_best_rows_number_input_lines_across_chunks(trained, cli, translator, mixed, chunk):
    expected = translator.translate_nbest(mixed, 3)
    r = cli("translate", "--model", trained.run, "--n-best", 3, "--chunk-lines", chunk,
            stdin="".join(line + "\n" for line in mixed))
    assert r.code == 0, r.err
    rows = [row.split("\t") for row in r.out.splitlines()]
    assert [(int(i), text) for i, _, text in rows] == [(i, t.text) for i, ts in enumerate(expected) for t in ts]
    assert [float(s) for _, s, _ in rows] == pytest.approx([t.score for ts in expected for t in ts], abs=2e-4)


def test_translate_stream_yields_chunks_in_order(translator, mixed):
    """The library call: chunks of ``chunk_lines`` results, concatenating to translate_nbest's."""
    done = []
    chunks = list(translator.translate_stream(iter(mixed), 4, n_best=1, progress=done.append))
    assert [len(c) for c in chunks] == [4] * (len(mixed) // 4) + ([len(mixed) % 4] if len(mixed) % 4 else [])
    assert [r[0].text for c in chunks for r in c] == translator.translate(mixed)
    assert sum(done) == len(mixed)  # every line reported done once, empty ones included
    with pytest.raises(ValueError, match="chunk_lines"):
        next(translator.translate_stream(mixed, 0))


def test_stdout_is_flushed_chunk_by_chunk(trained, cli, monkeypatch, translator):
    """Each chunk reaches stdout, complete and flushed, before the next one is translated."""
    class Recorder:
        def __init__(self):
            self.pending, self.flushed = "", []

        def write(self, text):
            self.pending += text

        def flush(self):
            if self.pending:
                self.flushed.append(self.pending)
            self.pending = ""

    out = Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    r = cli("translate", "--model", trained.run, "--chunk-lines", 2, stdin="".join(line + "\n" for line in LINES[:5]))
    assert r.code == 0, r.err
    expected = translator.translate(LINES[:5])
    assert out.flushed == ["".join(t + "\n" for t in expected[i:i + 2]) for i in (0, 2, 4)]


# ---- a real process on pipes: lines come out before the input ends; a closed pipe ends it quietly

@pytest.fixture
def start_translate(trained):
    """``start(*argv)`` -> a running ``python -m transformer translate --model RUN *argv`` on
    pipes (killed at teardown if still running)."""
    procs = []

    def start(*argv):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "transformer", "translate", "--model", str(trained.run),
                                       *map(str, argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env))
        return procs[-1]

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


class LineReader:
    """The lines of a child's stdout, read by a thread, so a test can wait for one with a timeout."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def next(self, timeout: float = 60) -> str:
        try:
            return self.lines.get(timeout=timeout).decode().rstrip("\n")
        except queue.Empty:
            raise AssertionError("no output line while the input is still open: the command is not streaming")


def test_lines_come_out_before_the_input_ends(start_translate, translator):
    proc = start_translate("--chunk-lines", 3)
    proc.stdin.write("".join(line + "\n" for line in LINES[:3]).encode())
    proc.stdin.flush()  # and keep stdin open: a command that waits for the end of input never answers
    out = LineReader(proc.stdout)
    assert [out.next() for _ in range(3)] == translator.translate(LINES[:3])
    proc.stdin.write(b"small bird\n")
    proc.stdin.close()
    assert out.next() == translator.translate(["small bird"])[0]
    assert proc.wait(60) == 0 and proc.stderr.read() == b""
    out.thread.join(10)
    assert out.lines.empty()  # nothing more than the four lines


def test_closed_stdout_ends_quietly(start_translate):
    """`transformer translate ... | head -n 1`: the reader goes away, the command stops at its
    next write with exit 1 and nothing on stderr (no traceback, no "Exception ignored")."""
    proc = start_translate("--chunk-lines", 1)
    proc.stdin.write(b"red dog runs\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 60)  # no reader thread: this end is closed below
    assert ready and os.read(proc.stdout.fileno(), 1 << 16).strip(), "no output while the input is open"
    proc.stdout.close()  # as head does after its line
    proc.stdin.write(b"".join(line.encode() + b"\n" for line in LINES * 20))
    proc.stdin.close()
    assert proc.wait(60) == 1
    assert proc.stderr.read().decode() == ""


# ---- --output: complete or not at all ------------------------------------------------------------

PRECIOUS = "an earlier translation\n"


@pytest.mark.parametrize("error", [RuntimeError("decoder blew up"), KeyboardInterrupt()])
def test_failure_midway_leaves_no_output_and_keeps_the_old_one(trained, cli, monkeypatch, in_file, tmp_path, error):
    """The first chunk is translated (and written to the temporary file), the second fails:
    the --output file keeps its earlier content and no temporary file is left."""
    calls = []
    real = Translator.translate_nbest

    def failing(self, lines, *args, **kwargs):
        calls.append(len(lines))
        if len(calls) == 2:
            raise error
        return real(self, lines, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_nbest", failing)
    out = tmp_path / "out" / "out.txt"
    out.parent.mkdir()
    out.write_text(PRECIOUS, encoding="utf-8")
    if isinstance(error, KeyboardInterrupt):
        r = cli("translate", "--model", trained.run, "--input", in_file, "--output", out, "--chunk-lines", 4)
        assert r.code == 130 and "interrupted" in r.err
    else:
        with pytest.raises(RuntimeError, match="blew up"):
            cli("translate", "--model", trained.run, "--input", in_file, "--output", out, "--chunk-lines", 4)
    assert calls == [4, 4]
    assert [p.name for p in out.parent.iterdir()] == ["out.txt"]
    assert out.read_text(encoding="utf-8") == PRECIOUS


def test_bad_line_after_the_first_chunk(trained, cli, tmp_path, one_line_error):
    """Invalid UTF-8 far into the input: one line naming file:line, the old --output kept."""
    src = tmp_path / "late.txt"
    src.write_bytes("".join(line + "\n" for line in LINES[:6]).encode() + b"the caf\xe9 near the park\n")
    out = tmp_path / "out.txt"
    out.write_text(PRECIOUS, encoding="utf-8")
    r = cli("translate", "--model", trained.run, "--input", src, "--output", out, "--chunk-lines", 2)
    one_line_error(r, "translate", f"{src}:7:", "UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.txt", "out.txt"]
    assert out.read_text(encoding="utf-8") == PRECIOUS


@pytest.mark.parametrize("value", ["0", "-3"])
def test_chunk_lines_must_be_positive(trained, cli, in_file, value, one_line_error):
    one_line_error(cli("translate", "--model", trained.run, "--input", in_file, "--chunk-lines", value),
                   "translate", "--chunk-lines", value)


# ---- the progress bar: on a terminal only ----------------------------------------------------------

def pretend_terminal(monkeypatch) -> None:
    """Make the captured stderr say it is a terminal (called in the test itself: pytest puts
    the capturing stream in place for the test's call only)."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)


def test_progress_bar_for_an_input_file_on_a_terminal(trained, cli, translator, in_file, mixed, monkeypatch):
    pretend_terminal(monkeypatch)
    r = cli("translate", "--model", trained.run, "--input", in_file, "--chunk-lines", 5)
    assert r.code == 0, r.err
    assert r.out.split("\n") == translator.translate(mixed) + [""]  # the bar goes to stderr only
    assert f"{len(mixed)}/{len(mixed)}" in r.err and "line" in r.err


def test_no_progress_bar_for_stdin(trained, cli, monkeypatch):
    pretend_terminal(monkeypatch)
    r = cli("translate", "--model", trained.run, stdin="red dog runs\n")
    assert r.code == 0 and [line for line in r.err.splitlines() if not line.startswith("device: cpu (")] == []


def _evaluate(cli, trained, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    ref.write_text("".join(" ".join("x" + w[::-1] for w in line.split()) + "\n" for line in LINES), encoding="utf-8")
    r = cli("evaluate", "--model", trained.run, "--src", src, "--ref", ref, "--json")
    assert r.code == 0, r.err
    scores = json.loads(r.out)
    scores.pop("seconds")
    return scores, r.err


def test_evaluate_progress_bar_on_a_terminal_only(trained, cli, tmp_path, monkeypatch):
    plain, err = _evaluate(cli, trained, tmp_path)
    assert err == ""
    pretend_terminal(monkeypatch)
    with_bar, err = _evaluate(cli, trained, tmp_path)
    assert f"{len(LINES)}/{len(LINES)}" in err
    assert with_bar == plain and plain["bleu"] > 0


def test_chunk_lines_past_what_islice_takes_is_one_chunk(trained, cli, translator):
    """--chunk-lines 10**20 (more than sys.maxsize) ended in islice's ValueError traceback;
    it is the whole input in one chunk, as any number above its length."""
    r = cli("translate", "--model", trained.run, "--chunk-lines", 10**20, stdin="".join(line + "\n" for line in LINES[:3]))
    assert r.code == 0, r.err
    assert r.out.splitlines() == translator.translate(LINES[:3])
