# Two commands set everything up on a fresh machine:
#   make demo   creates .venv, installs foco, runs the main job on the embedded world
#   make test   creates .venv, installs foco with test deps, runs the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
RUNS   ?= runs
SIZE   ?= default
# A CPU build of torch; plain `pip install torch` would fetch a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[world,hf,decompose,lora,plot,serve,dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/foco quickstart --out $(RUNS)/quickstart --size $(SIZE)

test: install
	$(PY) -m pytest

clean:
	rm -rf $(VENV) $(RUNS)
