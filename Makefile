# jupyter-gpu-gov — the README's commands. Needs only python3 (>= 3.10), node (>= 20) and npm.
#
#   make demo    run the demo hub on http://127.0.0.1:8000 (simulated GPUs)
#   make test    pytest, then ruff check and ruff format --check
#
# .venv and node_modules are created on first use; stamp files keyed on pyproject.toml and
# package.json / package-lock.json make later runs skip the install.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore

.PHONY: help venv node_modules demo test lint format bench clean distclean

help:
	@echo "make demo       run the demo JupyterHub on http://127.0.0.1:8000 (simulated GPUs)"
	@echo "make test       pytest, ruff check, ruff format --check"
	@echo "make lint       ruff check + ruff format --check"
	@echo "make format     ruff check --fix + ruff format"
	@echo "make bench      python -m benchmarks"
	@echo "make venv       create .venv and install -e '.[test]'"
	@echo "make node_modules  npm ci (configurable-http-proxy)"
	@echo "make clean      remove caches, build output and .demo/ state"
	@echo "make distclean  clean + remove .venv and node_modules"

venv: $(VENV_STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Editable install: pip builds it in an isolated env from [build-system] (hatchling, editables).
$(VENV_STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e ".[test]"
	touch $@

node_modules: $(NODE_STAMP)

# npm ci when a lockfile exists (CI and fresh clones get exactly the locked tree).
$(NODE_STAMP): package.json $(wildcard package-lock.json)
	if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; \
	else npm install --no-audit --no-fund; fi
	touch $@

demo: venv node_modules
	mkdir -p .demo
	$(VENV)/bin/jupyterhub -f hub_config/jupyterhub_config.py

test: venv node_modules
	$(VPY) -m pytest -q
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: venv
	$(VPY) -m benchmarks

clean:
	rm -rf .demo .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -path ./node_modules -prune -o \
		-name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) node_modules
