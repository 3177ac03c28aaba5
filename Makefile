# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install, train the default model and translate with it
#   make test   create .venv, install, run the test suite
# TORCH picks the torch build that .venv gets when it is created (make run TORCH=cpu):
#   default  pip's own torch==2.13.0 from PyPI (on Linux x86-64 the CUDA build, gigabytes)
#   cpu      PyTorch's CPU-only build, from its own index (download.pytorch.org)
#   cuda     the PyPI wheel, for an NVIDIA GPU (the same wheel as default, said explicitly)
# .venv keeps the build it was made with; to change it, remove .venv and run make again.
PYTHON ?= python3.11
TORCH  ?= default
VENV   := .venv
BIN    := $(VENV)/bin

TORCH_VERSION      := 2.13.0
TORCH_FROM_default :=
TORCH_FROM_cuda    :=
TORCH_FROM_cpu     := --index-url https://download.pytorch.org/whl/cpu
TORCH_WHEEL_default := pypi
TORCH_WHEEL_cuda    := pypi
TORCH_WHEEL_cpu     := cpu

ifeq ($(filter $(TORCH),default cpu cuda),)
$(error TORCH=$(TORCH): give default, cpu or cuda)
endif
# A build asked for on the command line that .venv was not made with would be silently ignored.
INSTALLED_TORCH := $(if $(wildcard $(VENV)/.installed),$(or $(shell cat $(VENV)/.installed),default))
ifeq ($(origin TORCH),command line)
ifneq ($(INSTALLED_TORCH),)
ifneq ($(TORCH_WHEEL_$(INSTALLED_TORCH)),$(TORCH_WHEEL_$(TORCH)))
$(error .venv holds the TORCH=$(INSTALLED_TORCH) build; remove .venv (rm -rf .venv) to install TORCH=$(TORCH))
endif
endif
endif

.PHONY: setup run test toy demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION) $(TORCH_FROM_$(TORCH))
	$(BIN)/pip install --quiet -e '.[test]'
	echo $(TORCH) > $@

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
