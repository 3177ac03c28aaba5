"""`transformer translate`: stdin to stdout, files, input order, empty and overlong lines,
n-best lists, greedy decoding."""
from __future__ import annotations

import os
import random
import re
import shutil
import stat

import pytest

from transformer.inference.translator import load_translator

LINES = [
    "red dog runs", "the big cat sits under the tree", "a woman plays with a ball near the house",
    "small bird", "the man sees a green car", "child eats", "blue water near the park",
    "a cat and a dog", "big tree", "the woman runs with the child in the street", "green ball", "man sits",
]


@pytest.fixture(scope="module")
def alone(trained):
    """line -> its translation when translated on its own (beam 4, the CLI's default)."""
    tr = load_translator(trained.run, beam=4)
    return {line: tr.translate([line])[0] for line in LINES}


def test_stdin_to_stdout_real_process(trained, alone, real_cli):
    text = "".join(line + "\n" for line in LINES[:3])
    done = real_cli("translate", "--model", trained.run, input=text)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [alone[line] for line in LINES[:3]]
    assert "Traceback" not in done.stderr


def test_translations_are_plausible(alone, target_words):
    """The toy model learned the word-for-word mapping at least partly, so the order tests
    below compare input-dependent outputs, not one constant string."""
    words = [w for t in alone.values() for w in t.split()]
    assert sum(w in target_words for w in words) > 0.6 * len(words)
    assert len(set(alone.values())) >= len(LINES) - 1


@pytest.mark.parametrize("max_tokens", [4000, 12])  # one batch / many batches
def test_output_order_equals_input_order(trained, cli, alone, max_tokens):
    lines = LINES * 2
    random.Random(max_tokens).shuffle(lines)
    r = cli("translate", "--model", trained.run, "--max-tokens", max_tokens, stdin="\n".join(lines) + "\n")
    assert r.code == 0, r.err
    assert r.out.splitlines() == [alone[line] for line in lines]


def test_input_and_output_files(trained, cli, alone, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "sub" / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    r = cli("translate", "--model", trained.run, "--input", src, "--output", out)
    assert r.code == 0, r.err
    assert r.out == ""  # everything went to the file
    assert out.read_text(encoding="utf-8") == "".join(alone[line] + "\n" for line in LINES)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.txt"]  # no temporary left behind


def test_output_may_overwrite_the_input(trained, cli, alone, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("red dog runs\nsmall bird\n", encoding="utf-8")
    r = cli("translate", "--model", trained.run, "--input", path, "--output", path)
    assert r.code == 0, r.err
    assert path.read_text(encoding="utf-8") == f"{alone['red dog runs']}\n{alone['small bird']}\n"


def test_input_file_without_final_newline(trained, cli, alone, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red dog runs\nsmall bird", encoding="utf-8")
    r = cli("translate", "--model", trained.run, "--input", src)
    assert r.out.splitlines() == [alone["red dog runs"], alone["small bird"]]


def test_empty_lines_keep_their_position(trained, cli, alone):
    lines = ["red dog runs", "", "small bird", "   ", "\t", "man sits"]
    r = cli("translate", "--model", trained.run, stdin="\n".join(lines) + "\n")
    assert r.code == 0, r.err
    assert r.out.split("\n") == [alone["red dog runs"], "", alone["small bird"], "", "", alone["man sits"], ""]


def test_trailing_empty_line_on_stdin(trained, cli, alone):
    r = cli("translate", "--model", trained.run, stdin="red dog runs\n\n")
    assert r.out == alone["red dog runs"] + "\n\n"


def test_trailing_empty_line_in_input_file(trained, cli, alone, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red dog runs\n\n", encoding="utf-8")
    r = cli("translate", "--model", trained.run, "--input", src)
    assert r.out == alone["red dog runs"] + "\n\n"


def test_overlong_line_warns_and_still_translates(trained, cli, alone):
    long_line = " ".join(["dog", "cat", "tree", "runs"] * 500)  # 2000 words, far over max_len
    r = cli("translate", "--model", trained.run, stdin=f"red dog runs\n{long_line}\nsmall bird\n")
    assert r.code == 0, r.err
    out = r.out.split("\n")
    assert len(out) == 4 and out[3] == ""
    assert out[0] == alone["red dog runs"] and out[2] == alone["small bird"]
    assert out[1].strip()  # a translation of the line's beginning
    warnings = [line for line in r.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "1 line(s) longer than" in warnings[0], r.err
    assert "Traceback" not in r.err


def test_n_best(trained, cli, alone):
    lines = ["red dog runs", "", "small bird"]
    r = cli("translate", "--model", trained.run, "--n-best", 3, "--beam", 4, stdin="\n".join(lines) + "\n")
    assert r.code == 0, r.err
    rows = [line.split("\t") for line in r.out.splitlines()]
    assert len(rows) == 9 and all(len(row) == 3 for row in rows)
    assert [int(row[0]) for row in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for i in (0, 2):
        group = rows[3 * i: 3 * i + 3]
        scores = [float(row[1]) for row in group]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
        assert all(re.fullmatch(r"-?\d+\.\d{4}", row[1]) for row in group)
        assert len({row[2] for row in group}) >= 2  # not one hypothesis repeated
        assert group[0][2] == alone[lines[i]]  # the best one is the 1-best translation
    assert rows[3:6] == [["1", "0.0000", ""]] * 3  # an empty line: empty hypotheses


def test_greedy(trained, cli):
    greedy = load_translator(trained.run, beam=1)
    r = cli("translate", "--model", trained.run, "--beam", 1, stdin="\n".join(LINES) + "\n")
    assert r.code == 0, r.err
    assert r.out.splitlines() == greedy.translate(LINES)
    r2 = cli("translate", "--model", trained.run, "--beam", 1, "--n-best", 1, "--input", os.devnull)
    assert r2.code == 0 and r2.out == ""  # no input, no output


def test_model_as_weights_file(trained, cli, alone):
    r = cli("translate", "--model", trained.run / "best.safetensors", stdin="red dog runs\n")
    assert r.code == 0, r.err
    assert r.out == alone["red dog runs"] + "\n"


def test_output_file_has_ordinary_permissions(trained, cli, tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "out.txt"
        r = cli("translate", "--model", trained.run, "--output", out, stdin="red dog runs\n")
        assert r.code == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_output_over_a_private_file_keeps_it_private(trained, cli, tmp_path):
    """A file being replaced keeps its mode: translating over a 0600 file left it 0644."""
    old = os.umask(0o022)
    try:
        out = tmp_path / "out.txt"
        out.write_text("earlier, private\n")
        out.chmod(0o600)
        r = cli("translate", "--model", trained.run, "--output", out, stdin="red dog runs\n")
        assert r.code == 0, r.err
        assert out.read_text() != "earlier, private\n"
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_invalid_utf8_on_stdin_real_process(trained, real_cli):
    """Bytes that are not UTF-8 on stdin: a one-line error naming stdin, never a traceback."""
    done = real_cli("translate", "--model", trained.run, input=b"red dog\n\xff\xfe cat\n",
                    env={"LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"})
    err = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and done.returncode == 2, err
    assert err.startswith("transformer translate: error: ") and len(err.splitlines()) == 1
    assert "stdin" in err and ":2" in err


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_lower_precisions_translate_like_fp32(trained, cli, alone, precision):
    """--precision bf16 / int8 decode with converted weights; on this toy model the
    translations mostly stay those of fp32."""
    r = cli("translate", "--model", trained.run, "--precision", precision, stdin="\n".join(LINES) + "\n")
    assert r.code == 0, r.err
    out = r.out.splitlines()
    assert len(out) == len(LINES)
    assert sum(o == alone[line] for o, line in zip(out, LINES)) >= len(LINES) // 2


def test_with_decoding_shares_the_converted_model(trained):
    """The service keeps one Translator per beam size: each shares the converted model and
    translates like a Translator built for that beam size."""
    tr = load_translator(trained.run, beam=4, precision="bf16")
    greedy = tr.with_decoding(beam=1)
    assert greedy.model is tr.model and greedy.decoding.precision == "bf16"
    assert (greedy.decoding.beam, tr.decoding.beam) == (1, 4)
    assert greedy.translate(LINES) == load_translator(trained.run, beam=1, precision="bf16").translate(LINES)


def _nbest_scores(r) -> list[tuple[str, float]]:
    assert r.code == 0, r.err
    return [(row.split("\t")[2], float(row.split("\t")[1])) for row in r.out.splitlines()]


def test_several_models_decode_as_an_ensemble(trained, cli):
    """`--model A B`: one checkpoint twice is that checkpoint (same texts and scores); two
    different checkpoints give scores that neither gives alone."""
    first, second = sorted((trained.run / "checkpoints").iterdir())[-2:]
    lines = "\n".join(LINES[:4]) + "\n"
    alone = [_nbest_scores(cli("translate", "--model", m, "--n-best", 2, stdin=lines)) for m in (first, second)]
    twice = _nbest_scores(cli("translate", "--model", first, first, "--n-best", 2, stdin=lines))
    assert [t for t, _ in twice] == [t for t, _ in alone[0]]
    assert [s for _, s in twice] == pytest.approx([s for _, s in alone[0]], abs=2e-4)
    both = _nbest_scores(cli("translate", "--model", first, second, "--n-best", 2, stdin=lines))
    assert len(both) == 8
    for single in alone:
        assert [s for _, s in both] != pytest.approx([s for _, s in single], abs=1e-3)


def test_ensemble_of_different_runs_is_refused(trained, cli, tmp_path, one_line_error):
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    ckpt = sorted((trained.run / "checkpoints").iterdir())[-1]
    shutil.copytree(ckpt, other / "checkpoints" / ckpt.name)
    (other / "subwords.model").write_bytes(b"another subword model")
    r = cli("translate", "--model", trained.run, other, stdin="red dog runs\n")
    one_line_error(r, "translate", other / "subwords.model", "ensemble")


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_repeated_model_option_adds_ensemble_members_instead_of_dropping_the_first(command):
    from transformer.cli import build_parser

    args = build_parser().parse_args([command, "--model", "a", "b", "--model", "c"])
    assert args.model == ["a", "b", "c"]
    assert build_parser().parse_args([command, "--model", "a"]).model == ["a"]


def test_output_through_a_link_or_into_a_pipe(trained, cli, alone, tmp_path):
    """--output names what is not a plain file: a symbolic link keeps being one (its target
    gets the text), and a named pipe (as /dev/stdout or /dev/null are not files) is written
    into, not replaced by a file, so its reader gets the translations."""
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old\n", encoding="utf-8")
    link.symlink_to(real)
    r = cli("translate", "--model", trained.run, "--output", link, stdin="red dog runs\n")
    assert r.code == 0, r.err
    assert link.is_symlink()
    assert real.read_text(encoding="utf-8") == alone["red dog runs"] + "\n"

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # open first, so the writer's open does not block
    try:
        r = cli("translate", "--model", trained.run, "--output", pipe, stdin="red dog runs\nsmall bird\n")
        assert r.code == 0, r.err
        assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
        assert os.read(reader, 1 << 16).decode() == f"{alone['red dog runs']}\n{alone['small bird']}\n"
    finally:
        os.close(reader)


def _typed(argv: list[str], lines: list[bytes], timeout: float = 120) -> str:
    """What a terminal shows when ``lines`` are typed, one at a time, into ``transformer
    *argv`` run on a pseudo-terminal (stdin, stdout and stderr), then Ctrl-D."""
    import pty
    import select
    import time

    from tiny_corpus import TRANSFORMER, process_env

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        try:
            os.execve(TRANSFORMER, [TRANSFORMER, *argv], process_env())
        finally:
            os._exit(127)
    shown, deadline = b"", time.monotonic() + timeout

    def read_until(marker: bytes, count: int) -> None:
        nonlocal shown
        while shown.count(marker) < count and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    return
                if not chunk:
                    return
                shown += chunk

    read_until(b"Ctrl-D to quit", 1)
    for n, line in enumerate(lines, start=1):
        os.write(fd, line + b"\n")
        read_until(b"\n", 2 * n + 1)  # the echo of the line, then its answer
    os.write(fd, b"\x04")
    read_until(b"\0", 1)  # to the end
    os.waitpid(pid, 0)
    os.close(fd)
    return shown.decode("utf-8", "replace").replace("\r\n", "\n")


def test_a_typed_line_that_is_not_utf8_is_one_line_and_the_session_goes_on(trained, alone):
    """At a terminal, sentences are translated one by one. A line typed in Latin-1 ended the
    session in sentencepiece's "Unable to cast Python instance" traceback; it is one line
    saying so, and the next sentence is translated."""
    shown = _typed(["translate", "--model", str(trained.run)], [b"red dog runs", b"caf\xe9", b"small bird"])
    assert "Traceback" not in shown, shown
    assert "transformer translate: error: that line is not UTF-8 (byte 0xe9 at byte column 4)" in shown
    answers = [line for line in shown.splitlines() if line in alone.values()]
    assert answers == [alone["red dog runs"], alone["small bird"]], shown


def test_input_from_a_pipe_with_a_progress_bar_is_translated(trained, cli, alone, tmp_path, monkeypatch):
    """With a terminal on stderr, --input's lines were counted ahead for the progress bar's
    total; from a pipe (--input <(zcat ...), a named pipe) the count took the lines and
    nothing was translated (exit 0, empty output). A pipe is read once, the bar counts
    without a total."""
    import threading

    from transformer.cli import _progress

    monkeypatch.setattr(_progress, "stderr_is_terminal", lambda: True)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def feed():
        with open(pipe, "w", encoding="utf-8") as f:
            f.write("red dog runs\nsmall bird\n")

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    done = {}
    command = threading.Thread(target=lambda: done.update(r=cli("translate", "--model", trained.run, "--input", pipe)),
                               daemon=True)
    command.start()
    command.join(timeout=120)
    if command.is_alive():  # stuck opening the pipe a second time (no writer left): let it go on, then fail
        with open(pipe, "w"):
            pass
        command.join(timeout=60)
    writer.join(timeout=10)
    r = done["r"]
    assert r.code == 0, r.err
    assert r.out == f"{alone['red dog runs']}\n{alone['small bird']}\n"
