# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install, train the default model and translate with it
#   make test   create .venv, install, run the test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup run test toy demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# The main job: train the quick Multi30k en->de model (resumes if runs/demo holds a run),
# translate example sentences, score the test set. Multi30k is read from $TRANSFORMER_DATA
# when set, else downloaded once into ~/.cache/transformer/data.
run: setup
	$(BIN)/transformer train --config configs/demo.yaml --out runs/demo
	$(BIN)/transformer translate --model runs/demo --input examples/en.txt
	$(BIN)/transformer evaluate --model runs/demo --split test_2016_flickr

# The synthetic copy/reverse task: a tiny Transformer learns to reverse random sequences
# (`transformer toy`; not configs/demo.yaml, which `make run` trains). demo: its old name.
toy: setup
	$(BIN)/transformer toy --task reverse
demo: toy

test: setup
	bash .ci/install-browser.sh
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) runs .pytest_cache
