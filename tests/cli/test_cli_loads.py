"""What a command loads: `translate` only what translating needs (no exporter, plotting,
server, training or compiler modules, no optional package), and `--help` not even torch.
Start-up time itself is measured in benchmarks/startup.md, not here."""
from __future__ import annotations

import json
import subprocess
import sys

from tiny_corpus import process_env

# Run in a fresh interpreter (this one has imported everything already); prints the modules
# loaded, whatever the command did, as the last line of stderr.
PROBE = """
import json, sys
from transformer.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
sys.exit(code)
"""
# what translating one sentence must not load: this package's other concerns ...
NOT_FOR_TRANSLATE = ("transformer.interop", "transformer.serve", "transformer.viz", "transformer.train",
                     "transformer.evaluation.translation", "transformer.baselines", "transformer.compiling",
                     # ... torch's compiler (an eager translation compiles nothing) and optional packages
                     "torch._dynamo", "torch._inductor", "matplotlib", "fastapi", "uvicorn", "starlette", "pydantic",
                     "transformers", "tokenizers", "huggingface_hub", "ctranslate2", "onnx", "onnxruntime",
                     "tensorboard", "sacrebleu", "sacremoses")


def loaded(*argv: str, stdin: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], input=stdin, capture_output=True, text=True,
                          env=process_env(), timeout=120)
    return done, json.loads(done.stderr.splitlines()[-1])


def test_translate_loads_only_what_translating_needs(trained):
    done, modules = loaded("translate", "--model", str(trained.run), stdin="red dog runs\n")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    assert "transformer.inference.translator" in modules and "torch" in modules  # (the probe sees what was loaded)
    assert [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_TRANSLATE)] == []


def test_help_and_usage_errors_load_no_torch():
    for argv in (["translate", "--help"], ["serve", "--help"], ["translate", "--beam", "two"]):
        done, modules = loaded(*argv)
        assert done.returncode == (0 if "--help" in argv else 2), done.stderr[-2000:]
        assert "torch" not in modules and "numpy" not in modules, argv
