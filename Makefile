# Two commands on a fresh machine:
#   make serve   install, make synthetic data, train a small default model (if none), export it,
#                start Triton, the session store (SQLite under .routerkt/) and the gateway, print one sample
#                prediction and one Observe + Predict by learner id (Ctrl-C stops both)
#   make test    install, then run every test (unit, integration, e2e with a real tritonserver,
#                redis-server and haproxy; the Makefile installs Debian's packages when they are missing)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RKT := $(BIN)/routerkt
# (the training commands set GLIBC_TUNABLES=glibc.malloc.mmap_max=0 themselves: routerkt/cli.py)

DEFAULT_DATA := data/synthetic.csv
DEFAULT_RUN := runs/default
DEFAULT_MODEL := routerkt-akt
PYTEST_ARGS ?=

.PHONY: install test serve unit integration e2e bench clean-default

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip==25.3"

# torch is pinned to its CPU build (torch==2.13.0+cpu in pyproject.toml). That wheel comes from
# PyTorch's CPU index, unless a torch-2.13.0+cpu wheel already lies in $(PIP_FIND_LINKS) (a local
# wheel folder): then no extra index is passed, so an offline machine never waits on it.
TORCH_INDEX := $(if $(wildcard $(addsuffix /torch-2.13.0+cpu*,$(PIP_FIND_LINKS))),,--extra-index-url https://download.pytorch.org/whl/cpu)

# Re-install only when the project's dependencies change. The session store's tests and
# `routerkt bench load --sessions` need a real redis-server, the learner router's test a real haproxy: Debian's
# packages, installed once.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	command -v redis-server >/dev/null || command -v valkey-server >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } || \
	  { echo "install redis-server (or valkey-server) for the session-store tests" >&2; exit 1; }
	command -v haproxy >/dev/null || command -v /usr/sbin/haproxy >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; } || \
	  { echo "install haproxy for the learner router's test (serving/deploy/k8s/haproxy.cfg)" >&2; exit 1; }
	$(BIN)/pip install -q $(TORCH_INDEX) -e ".[all]"
	touch $@

install: $(VENV)/.installed

# Two workers (pytest-xdist), a test file per worker at a time: module fixtures (a Triton, a trained
# tiny model) are made once per file; TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

e2e: install
	$(BIN)/python -m pytest tests/e2e $(PYTEST_ARGS)

$(DEFAULT_DATA): | install
	$(RKT) synth --out $@ --learners 600 --seed 7

$(DEFAULT_RUN)/metrics.json: | $(DEFAULT_DATA) install
	$(RKT) train --data $(DEFAULT_DATA) --preset $(DEFAULT_MODEL) --folds 1 --epochs 4 --set train.batch_size=64 --out $(DEFAULT_RUN)

model_repository/$(DEFAULT_MODEL)/config.pbtxt: | $(DEFAULT_RUN)/metrics.json install
	$(RKT) export --run $(DEFAULT_RUN) --repository model_repository --name $(DEFAULT_MODEL)

serve: install model_repository/$(DEFAULT_MODEL)/config.pbtxt
	$(RKT) serve --repository model_repository --sample-model $(DEFAULT_MODEL)

clean-default:
	rm -rf $(DEFAULT_RUN) model_repository/$(DEFAULT_MODEL)
