# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install the project, train the default model and translate with it
#   make test   the same .venv plus the test extras (every optional library and the test tools),
#               then the test suite
# TORCH picks the torch build that .venv gets when it is created (make run TORCH=cpu):
#   auto     (unset) the machine decides: the CUDA build when nvidia-smi lists an NVIDIA GPU,
#            else the CPU build from PyTorch's own index, or PyPI's wheel when that index
#            cannot be reached within seconds (as on a machine that reaches PyPI only)
#   cpu      PyTorch's CPU-only build, from its own index (download.pytorch.org)
#   cuda     pip's own torch==2.13.0 from PyPI (on Linux x86-64 the CUDA build, gigabytes)
# .venv keeps the build it was made with; to change it, remove .venv and run make again.
PYTHON ?= python3.11
TORCH  ?= auto
VENV   := .venv
BIN    := $(VENV)/bin

TORCH_VERSION := 2.13.0
CPU_INDEX     := --index-url https://download.pytorch.org/whl/cpu

ifeq ($(filter $(TORCH),auto cpu cuda),)
$(error TORCH=$(TORCH): give auto, cpu or cuda)
endif
HAS_NVIDIA_GPU := $(if $(filter auto,$(TORCH)),$(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes))
BUILD := $(if $(filter auto,$(TORCH)),$(if $(HAS_NVIDIA_GPU),cuda,cpu-or-pypi),$(TORCH))

TORCH_INSTALL_cpu  := $(BIN)/pip install --quiet torch==$(TORCH_VERSION) $(CPU_INDEX) && echo cpu > $(VENV)/.torch
TORCH_INSTALL_cuda := $(BIN)/pip install --quiet torch==$(TORCH_VERSION) && echo cuda > $(VENV)/.torch
TORCH_INSTALL_cpu-or-pypi := $(BIN)/pip install --quiet --timeout 10 --retries 0 torch==$(TORCH_VERSION) $(CPU_INDEX) \
	&& echo cpu > $(VENV)/.torch \
	|| { echo "setup: PyTorch's CPU index cannot be reached; installing PyPI's torch==$(TORCH_VERSION) instead" >&2; \
	     $(BIN)/pip install --quiet torch==$(TORCH_VERSION) && echo cuda > $(VENV)/.torch; }

# A build asked for (on the command line or in the environment) that .venv was not made with
# would be silently ignored. .venv/.torch names the wheel it holds: cpu, or cuda for PyPI's
# (older .venvs wrote .installed instead: empty or "default" meant PyPI's wheel).
WHEEL_OF := $(strip $(if $(wildcard $(VENV)/.torch),$(shell cat $(VENV)/.torch),\
	$(if $(wildcard $(VENV)/.installed),$(patsubst default,cuda,$(or $(shell cat $(VENV)/.installed),default)))))
ifneq ($(filter command line environment,$(origin TORCH)),)
ifneq ($(filter cpu cuda,$(TORCH)),)
ifneq ($(WHEEL_OF),)
ifneq ($(WHEEL_OF),$(TORCH))
$(error .venv holds the TORCH=$(WHEEL_OF) build; remove .venv (rm -rf .venv) to install TORCH=$(TORCH))
endif
endif
endif
endif

.PHONY: setup setup-test run test toy demo clean

# The project and what its commands need (no optional extra).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(if $(wildcard $(VENV)/.torch),,$(TORCH_INSTALL_$(BUILD)))
	$(BIN)/pip install --quiet -e .
	touch $@

# The test suite's: every extra (serve, export, interop, tensorboard) and the test tools.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

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

# The explorer page's browser tests need Chromium: as root, .ci/install-browser.sh installs
# Debian's package with apt-get the first time (it says so before it starts); otherwise they skip.
test: setup-test
	bash .ci/install-browser.sh
	$(BIN)/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) runs .pytest_cache
