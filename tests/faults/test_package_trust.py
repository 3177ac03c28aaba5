"""Nothing in a run directory runs code: a compiled decoding step (a package holding a shared
library, compiled/build.py) is loaded only from the user's own cache (compiled/packages.py), and
only when its SHA-256 is the one its build recorded; a run's own compiled/ folder is never
read. TRANSFORMER_COMPILE=off turns compiled decoding off everywhere; a step that cannot be
built, or vanishes while it is loaded, leaves decoding eager, with one warning line.

Two packages are really built here (run A's, then run B's in place of the one refused);
the rest use the real eager step or stand-in builds."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_corpus import process_env, train_tiny_run

from transformer import compiled
from transformer.compiled import build as aot, packages
from transformer.decode import greedy_search
from transformer.run import load_model, private, save_weights
from transformer.inference.translator import load_translator

LINES = ["red dog runs", "small bird", "the cat sees a tree"]
STDIN = "".join(line + "\n" for line in LINES)
FP32_GREEDY = ("--beam", "1", "--precision", "fp32")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs A and B: the same subwords, different weights (B's translations differ from A's);
    A's greedy step built (into this session's cache: tests/conftest.py), the GEMM timing off
    as in ``without_gemm_timing``."""
    trained, _, _ = train_tiny_run(tmp_path_factory, "cli", eval_every=100, save_every=100, keep_last=3,
                                   log_every=50)
    root = tmp_path_factory.mktemp("trust")
    a, b = root / "A", root / "B"
    shutil.copytree(trained, a)
    shutil.copytree(trained, b)
    model, _ = load_model(a)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * p.std() * torch.randn_like(p))
    for f in b.glob("*.safetensors"):
        f.unlink()
    save_weights(model, b / "best.safetensors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(aot, "INDUCTOR_OPTIONS", {**aot.INDUCTOR_OPTIONS, "max_autotune_gemm": False})
        translator = load_translator(a, beam=1, precision="fp32", compile="on")
        translator.prepare()
        yield a, b


def package_of(run: Path) -> Path:
    """Where the run's greedy fp32 package lives in the user's cache (its name: a digest of the
    weights, which anyone can compute)."""
    model = load_translator(run, beam=1, precision="fp32").model
    return packages.run_folder(run) / aot.package_name(model, 1, True)


@pytest.fixture
def loads(monkeypatch) -> list[Path]:
    """Every package path aot.load is given."""
    seen: list[Path] = []
    monkeypatch.setattr(aot, "load", lambda path, load=aot.load: seen.append(Path(path)) or load(path))
    return seen


def test_a_package_put_under_another_runs_name_is_refused_and_a_run_folder_never_read(runs, cli, loads):
    a, b = runs
    a_package, b_package = package_of(a), package_of(b)
    assert packages.check(a_package) is None  # A's own package, as its build recorded it
    own = cli("translate", "--model", b, *FP32_GREEDY, "--compile", "off", stdin=STDIN)
    assert own.out != cli("translate", "--model", a, *FP32_GREEDY, "--compile", "off", stdin=STDIN).out
    # A's package under B's name: in B's folder of the cache (B's build had recorded another
    # digest), and in a compiled/ folder of B's run directory with a matching digest beside it
    b_package.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(a_package, b_package)
    packages.digest_file(b_package).write_text(hashlib.sha256(b"B's package as built").hexdigest() + "\n")
    in_run = b / "compiled" / b_package.name
    in_run.parent.mkdir()
    shutil.copyfile(a_package, in_run)
    shutil.copyfile(packages.digest_file(a_package), packages.digest_file(in_run))
    mark = b_package.stat().st_mtime_ns

    r = cli("translate", "--model", b, *FP32_GREEDY, stdin=STDIN)  # (--compile auto: the package "is there")
    assert r.code == 0, r.err
    assert r.out == own.out  # B's own translations
    assert len(r.err.splitlines()) == 1, r.err
    assert r.err.startswith(f"warning: {b_package}: its SHA-256 is not the one recorded when it was built; deleted, "
                            "building it again")
    assert loads == [b_package] and not any(b in p.parents for p in loads)
    assert b_package.stat().st_mtime_ns != mark and packages.check(b_package) is None  # rebuilt, its digest recorded
    assert in_run.read_bytes() == a_package.read_bytes()  # the run directory is not touched either

    # a package only in the run's compiled/ folder is not found there: B decodes eagerly (auto)
    packages.remove(b_package)
    loads.clear()
    r = cli("translate", "--model", b, *FP32_GREEDY, stdin=STDIN)
    assert (r.code, r.out, r.err, loads) == (0, own.out, "", [])


def test_compile_off_in_the_environment_wins(runs, cli, loads, monkeypatch):
    a, _ = runs
    assert packages.check(package_of(a)) is None  # A's package is there, and valid
    eager = cli("translate", "--model", a, *FP32_GREEDY, "--compile", "off", stdin=STDIN)
    monkeypatch.setenv("TRANSFORMER_COMPILE", "off")
    monkeypatch.setattr(aot, "build", lambda *a: pytest.fail("built"))
    for compile in ("on", "auto"):
        r = cli("translate", "--model", a, *FP32_GREEDY, "--compile", compile, stdin=STDIN)
        assert (r.code, r.out, r.err) == (0, eager.out, "")
    # the library too: a search asked to compile, the step asked for directly
    translator = load_translator(a, beam=1, precision="fp32")
    src = torch.tensor([translator.encode(LINES[0])])
    assert translator.with_decoding(compile="on").compiles() == (False, False)
    assert greedy_search(translator.model, src, step=compiled.step(translator.model, 1))[0][0].tokens == \
        greedy_search(translator.model, src)[0][0].tokens
    compiled.step(translator.model, 1).prepare()
    assert loads == []
    monkeypatch.setenv("TRANSFORMER_COMPILE", "sometimes")
    r = cli("translate", "--model", a, *FP32_GREEDY, stdin=STDIN)
    assert r.code == 2 and r.err.splitlines() == [
        "transformer translate: error: TRANSFORMER_COMPILE=sometimes: the settings are off (every decoding eager) "
        "and auto (the default: --compile decides); unset it or set it to off"]


# ---- without real builds (fake_builds: tests/conftest.py) ---------------------------------
def test_a_package_changed_after_its_build_is_deleted_and_built_again(make_model, tmp_path, fake_builds):
    folder = tmp_path / "cache" / "run-0123"
    model = make_model(seed=11)
    compiled.keep_in(model, folder)
    compiled.step(model, 1).prepare()
    path = fake_builds[0]
    assert path.parent == folder and packages.check(path) is None
    path.write_bytes(b"another package")  # (a load would run it)
    again = make_model(seed=11)  # another process, the same weights
    compiled.keep_in(again, folder)
    assert compiled.is_built(again, 1)
    with pytest.warns(UserWarning) as caught:
        compiled.step(again, 1).prepare()
    assert [str(w.message) for w in caught] == [
        f"{path}: its SHA-256 is not the one recorded when it was built; deleted, building it again"]
    assert fake_builds == [path, path] and path.read_bytes() == b"package" and packages.check(path) is None


def test_a_package_without_a_recorded_digest_is_not_used(make_model, tmp_path, fake_builds):
    folder = tmp_path / "cache" / "run-4567"
    model = make_model(seed=12)
    compiled.keep_in(model, folder)
    path = folder / aot.package_name(model, 1, True)
    folder.mkdir(mode=0o700, parents=True)
    path.write_bytes(b"package")
    assert not compiled.is_built(model, 1)  # compile=auto leaves it alone: decodes eagerly
    with pytest.warns(UserWarning, match="no SHA-256 was recorded for it by a build of this user's; deleted, "
                                         "building it again"):
        compiled.step(model, 1).prepare()  # compile=on: refused, built
    assert fake_builds == [path] and packages.check(path) is None


def test_a_failed_build_decodes_eagerly_with_one_warning(make_model, rand_tokens, monkeypatch, recwarn):
    def no_compiler(model, group, logprobs, path):
        raise RuntimeError("no C++ compiler found\n(and a long inductor traceback)")

    monkeypatch.setattr(aot, "build", no_compiler)
    monkeypatch.setattr(aot, "load", lambda path: pytest.fail("loaded"))
    model = make_model(seed=13)
    src = rand_tokens([5, 3, 6], width=6)
    eager = greedy_search(model, src)
    got = greedy_search(model, src, step=compiled.step(model, 1))
    assert [h[0].tokens for h in got] == [h[0].tokens for h in eager]
    assert [h[0].score for h in got] == pytest.approx([h[0].score for h in eager], abs=1e-4)
    assert [str(w.message) for w in recwarn] == [
        "cannot build the compiled decoding step (RuntimeError: no C++ compiler found); decoding eagerly"]


def test_a_failed_build_in_a_command_is_one_warning_line(runs, cli, monkeypatch):
    a, _ = runs
    monkeypatch.setattr(aot, "build", lambda *a: (_ for _ in ()).throw(RuntimeError("no C++ compiler found")))
    eager = cli("translate", "--model", a, "--beam", "4", "--precision", "fp32", "--compile", "off", stdin=STDIN)
    r = cli("translate", "--model", a, "--beam", "4", "--precision", "fp32", "--compile", "on", stdin=STDIN)
    assert (r.code, r.out) == (0, eager.out)
    assert r.err.splitlines() == [
        "compiling the decoding step (a minute or a few, once: it is kept in your cache)",
        "warning: cannot build the compiled decoding step (RuntimeError: no C++ compiler found); decoding eagerly"]


def test_a_package_that_vanishes_while_loaded_is_tried_once_more(make_model, tmp_path, fake_builds, monkeypatch):
    folder = tmp_path / "cache" / "run-89ab"
    model = make_model(seed=14)
    compiled.keep_in(model, folder)
    compiled.step(model, 1).prepare()  # built and recorded
    load, calls = aot.load, []

    def racing(path):  # another process removes it between the digest check and the load
        calls.append(path)
        if len(calls) == 1:
            packages.remove(Path(path))
            raise RuntimeError("cannot open the package")
        return load(path)

    monkeypatch.setattr(aot, "load", racing)
    again = make_model(seed=14)
    compiled.keep_in(again, folder)
    compiled.step(again, 1).prepare()  # no warning: built again, loaded
    assert len(calls) == 2 and len(fake_builds) == 2


def test_a_package_that_vanishes_twice_decodes_eagerly(make_model, rand_tokens, tmp_path, fake_builds, monkeypatch):
    def vanishing(path):
        packages.remove(Path(path))
        raise RuntimeError("cannot open the package")

    monkeypatch.setattr(aot, "load", vanishing)
    model = make_model(seed=15)
    compiled.keep_in(model, tmp_path / "cache" / "run-cdef")
    src = rand_tokens([4, 6], width=6)
    with pytest.warns(UserWarning) as caught:
        got = greedy_search(model, src, step=compiled.step(model, 1))
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "removed by another process while it was being loaded, twice; decoding eagerly"]
    assert [h[0].tokens for h in got] == [h[0].tokens for h in greedy_search(model, src)]


# ---- the cache folder ---------------------------------------------------------------------
def test_the_cache_is_the_users_own(monkeypatch, tmp_path):
    monkeypatch.delenv(packages.DIR_ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert packages.cache_root() == tmp_path / "xdg" / "transformer" / "compiled"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # (ignored, as the XDG spec says)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert packages.cache_root() == tmp_path / "home" / ".cache" / "transformer" / "compiled"
    monkeypatch.setenv(packages.DIR_ENV_VAR, str(tmp_path / "mine"))
    assert packages.cache_root() == tmp_path / "mine"
    # a run's folder: named after the run and its resolved path, made private on first use
    folder = packages.run_folder(tmp_path / "runs" / "wmt14 demo" / ".." / "wmt14 demo")
    assert folder.parent == tmp_path / "mine" and folder.name.startswith("wmt14_demo-")
    assert folder == packages.run_folder(tmp_path / "runs" / "wmt14 demo")
    assert folder != packages.run_folder(tmp_path / "other" / "wmt14 demo")
    assert packages.usable(folder) == folder
    for f in (folder, folder.parent):
        assert stat.S_IMODE(f.stat().st_mode) == 0o700


@pytest.mark.parametrize("problem", ["group-writable", "world-writable", "another owner"])
def test_a_cache_others_may_write_is_not_used(problem, make_model, tmp_path, fake_builds, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir(mode=0o700)
    if problem == "another owner":
        monkeypatch.setattr(packages.os, "geteuid", lambda: os.getuid() + 4242)
    else:
        root.chmod(0o770 if problem == "group-writable" else 0o777)
    folder = root / "run-0000"
    model = make_model(seed=16)
    compiled.keep_in(model, folder)
    assert not compiled.is_built(model, 1)
    with pytest.warns(UserWarning) as caught:
        compiled.step(model, 1).prepare()
        compiled.step(make_model(seed=17), 1).prepare()  # (warned once a process)
    reason = "owned by another user" if problem == "another owner" else "writable by other users"
    assert [str(w.message) for w in caught if reason in str(w.message)] == [str(caught[0].message)]
    assert str(caught[0].message).startswith(f"{root}: {reason}") and "temporary folder for this process" in \
        str(caught[0].message)
    assert fake_builds[0].parent == packages.scratch() and not any(root.rglob("*.pt2"))


# ---- the compiler's build folder ------------------------------------------------------------
def test_the_compiler_builds_in_a_private_folder_of_the_cache(monkeypatch, tmp_path):
    """torch's compiler writes the code it generates, then loads it, in TORCHINDUCTOR_CACHE_DIR;
    unset, that is torchinductor_USER in the shared temporary folder, a name another user can
    take first. Every build points it at the user's cache, made 0700."""
    monkeypatch.setenv(packages.DIR_ENV_VAR, str(tmp_path / "mine"))
    monkeypatch.delenv(private.BUILD_ENV_VAR, raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    from torch._inductor import codecache

    folder = private.use_private_build_folder()
    assert folder == tmp_path / "mine" / "inductor"
    assert codecache._HEADER_DIR == str(folder / "precompiled_headers")  # the C++ headers it precompiles too
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the AVX2 stand-in's kernels: a folder of their own
    monkeypatch.delenv(private.BUILD_ENV_VAR)
    assert private.use_private_build_folder() == tmp_path / "mine" / "inductor-avx2"
    assert codecache._HEADER_DIR == str(tmp_path / "mine" / "inductor-avx2" / "precompiled_headers")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setenv(private.BUILD_ENV_VAR, str(folder))
    assert os.environ[private.BUILD_ENV_VAR] == str(folder)
    for f in (folder, folder.parent):
        assert stat.S_IMODE(f.stat().st_mode) == 0o700
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(folder)  # where inductor itself now writes


# A build of a tiny model's greedy step in a process of its own (GEMM timing off, as the tests build)
BUILD_A_STEP = """
import sys
from transformer import ModelConfig, Transformer
from transformer.compiled import build as aot
aot.INDUCTOR_OPTIONS = {**aot.INDUCTOR_OPTIONS, "max_autotune_gemm": False}
model = Transformer(ModelConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, max_len=16))
aot.build(model.eval(), 1, True, sys.argv[1])
"""


def test_a_real_build_leaves_nothing_in_the_temporary_folder(tmp_path):
    """torch fixes the folder of the C++ headers it precompiles (and includes in every build)
    at precompiled_headers/ of torchinductor_USER in the temporary folder, whatever
    TORCHINDUCTOR_CACHE_DIR says: a name another user can create first and fill with a header
    of their own. A real build with HOME and TMPDIR fresh: the temporary folder is empty once
    the process ends, the headers are in the private build folder of the user's cache."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in process_env().items()
           if k not in (packages.DIR_ENV_VAR, private.BUILD_ENV_VAR, "XDG_CACHE_HOME", "ATEN_CPU_CAPABILITY")}
    done = subprocess.run([sys.executable, "-c", BUILD_A_STEP, str(tmp_path / "step.pt2")], capture_output=True,
                          text=True, env={**env, "HOME": str(home), "TMPDIR": str(tmp)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "step.pt2").is_file()
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == []
    headers = home / ".cache" / "transformer" / "compiled" / "inductor" / "precompiled_headers"
    assert list(headers.glob("*.h.gch"))


def test_a_real_build_wrote_its_code_into_the_private_folder(runs):
    """Run A's step was really built (the ``runs`` fixture): inductor's generated code is in the
    cache's inductor/ folder, not in the shared temporary folder's torchinductor_USER."""
    folder = Path(os.environ[private.BUILD_ENV_VAR])
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    assert folder == packages.cache_root() / (f"inductor-{capability}" if capability else "inductor")
    assert any(f.suffix in (".cpp", ".py", ".so") for f in folder.rglob("*"))


@pytest.mark.parametrize("problem", ["world-writable", "another owner"])
def test_a_build_folder_others_could_fill_is_refused(problem, monkeypatch, tmp_path):
    """A TORCHINDUCTOR_CACHE_DIR (given, or the cache's) that another user made or may write
    is not built in: a private temporary folder of the process's instead, one warning line."""
    planted = tmp_path / "torchinductor_victim"
    planted.mkdir()
    (planted / "planted.py").write_text("raise SystemExit('planted code ran')\n")
    if problem == "another owner":
        monkeypatch.setattr(packages.os, "geteuid", lambda: os.getuid() + 4242)
    else:
        planted.chmod(0o777)
    monkeypatch.setenv(private.BUILD_ENV_VAR, str(planted))
    with pytest.warns(UserWarning) as caught:
        folder = private.use_private_build_folder()
    reason = "owned by another user" if problem == "another owner" else "writable by other users"
    assert len(caught) == 1 and reason in str(caught[0].message)
    assert "; torch's compiler builds in a temporary folder for this process only" in str(caught[0].message)
    assert folder.parent == packages.scratch() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert os.environ[private.BUILD_ENV_VAR] == str(folder)


def test_leftovers_of_crashed_builds_are_swept_from_the_cache(tmp_path):
    folder = tmp_path / "cache" / "run-1111"
    folder.mkdir(mode=0o700, parents=True)
    old = [folder / ".search-greedy-float32-abc.pt2.x1y2.pt2", folder / ".search-greedy-float32-abc.pt2.sha256.q9.tmp"]
    live = folder / ".search-beam4-float32-def.pt2.z3w4.pt2"  # a build running now, in another process
    for p in [*old, live]:
        p.write_bytes(b"partial")
    long_ago = time.time() - 2 * packages.GRACE_S
    for p in old:
        os.utime(p, (long_ago, long_ago))
    assert packages.usable(folder) == folder
    assert [p for p in old if p.exists()] == [] and live.exists()
