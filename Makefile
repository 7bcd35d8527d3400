# Two commands set everything up on a fresh machine:
#   make demo   creates .venv, installs foco (world, decompose, plot, serve extras), runs the main job on the embedded world
#   make test       creates .venv, installs foco with every extra and the test deps (and Debian's chromium when root),
#                   runs the whole test suite on every core (pytest-xdist; PYTEST_WORKERS=0 runs it in one process)
#   make test-fast  the same without the end-to-end tests marked `slow`: the loop for daily work
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
RUNS   ?= runs
SIZE   ?= default
# pytest-xdist workers: auto = one per core; 0 = one process, no xdist
PYTEST_WORKERS ?= auto
# A CPU build of torch; plain `pip install torch` would fetch a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# pip compiles every module's bytecode as it installs (torch alone: 24 s of its 9 s without). Keep it: where
# PYTHONDONTWRITEBYTECODE is set (as on the development machines) an import never writes bytecode, and every process
# of the suite would compile torch and transformers again (make test: 1,167 CPU-seconds against 919).
PIPQ   := -q
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test test-fast install clean chromium

# What the demo needs (the world, the rule edit writer, figures, the search index); the tests add the rest.
$(VENV)/.installed-demo: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIPQ) --upgrade pip
	$(PIP) install $(PIPQ) "$(TORCH)"
	$(PIP) install $(PIPQ) -e ".[world,decompose,plot,serve]"
	touch $@

# clip-retrieval's real ClipClient for tests/test_clip_client.py: the package without its dependencies (its client
# module needs only requests; the rest of the package, Flask, torch models and all, is never imported).
CLIP_RETRIEVAL ?= clip-retrieval==2.45.0

$(VENV)/.installed: pyproject.toml $(VENV)/.installed-demo
	$(PIP) install $(PIPQ) -e ".[world,hf,decompose,lora,plot,serve,dev]"
	$(PIP) install $(PIPQ) --no-deps "$(CLIP_RETRIEVAL)"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed-demo
	$(VENV)/bin/foco quickstart --out $(RUNS)/quickstart --size $(SIZE)

# The browser test drives Debian's chromium (Playwright's own download cannot work offline): installed here when it
# is missing and we are root; otherwise that one test skips and says how to enable it.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; \
	  else echo "chromium is missing and this is not root: the browser test will be skipped (apt-get install chromium)"; fi

test: install chromium
	$(PY) -m pytest -n $(PYTEST_WORKERS)

test-fast: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow"

clean:
	rm -rf $(VENV) $(RUNS)
