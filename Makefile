# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install, train the default model and translate with it
#   make test   create .venv, install, run the test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
export TRANSFORMER_DATA ?= $(abspath ../shared/data)

.PHONY: setup run test demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# The main job: the copy/reverse demo (a tiny Transformer learns to reverse random sequences).
run: setup
	$(BIN)/transformer demo --task reverse

test: setup
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) runs .pytest_cache
