"""The README stays a page a user reads (at most 250 lines; the rest is in docs/), and what it
tells a newcomer to type agrees with the files it names: the language-model quick start is
configs/lm-text.yaml's own commands, and the TORCH builds are the Makefile's."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_fits_on_a_few_screens():
    assert len(README.splitlines()) <= 250


def test_the_language_model_quick_start_is_the_recipes_commands():
    recipe = (ROOT / "configs" / "lm-text.yaml").read_text(encoding="utf-8")
    commands = [" ".join(line.lstrip("#").split()) for line in recipe.splitlines()
                if re.match(r"#\s+transformer (train|generate) ", line)]
    readme = [" ".join(line.split()) for line in README.splitlines()
              if re.match(r"transformer (train .*lm-text|generate --model runs/mine )", line)]
    assert len(commands) == 2 and commands == readme


def test_the_torch_builds_are_the_makefiles():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    accepted = re.search(r"\$\(filter \$\(TORCH\),([^)]*)\)", makefile)[1].split()
    listed = re.findall(r"^\| `(\w+)`(?: \(unset\))? \|", README, re.M)
    assert sorted(listed) == sorted(accepted) == ["auto", "cpu", "cuda"]
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")  # installing without make
    assert "https://download.pytorch.org/whl/cpu" in makefile and "https://download.pytorch.org/whl/cpu" in usage
