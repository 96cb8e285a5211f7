# jupyter-gpu-gov — the README's commands. Needs only python3 (>= 3.10), node (>= 20) and npm.
#
#   make demo    run the demo hub on http://127.0.0.1:8000 (simulated GPUs)
#   make test    pytest, ruff check and ruff format --check, then the labextension's jest
#                tests and linters
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
DEMO_STAMP := $(VENV)/.installed-demo
COMMA := ,
NODE_STAMP := node_modules/.installed
LAB_NODE_STAMP := labextension/node_modules/.installed
LAB_BUILT := jupyter_gpu_gov/labextension/package.json
LAB_SOURCES := labextension/package.json $(wildcard labextension/src/*.ts labextension/src/*/*.ts \
	labextension/src/*/*.tsx labextension/style/*.css labextension/schema/*.json)

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore

.PHONY: help venv demo-venv node_modules labextension demo test test-lowest lint format bench \
	bench-full grafana-configmap dist clean distclean

help:
	@echo "make demo       run the demo JupyterHub on http://127.0.0.1:8000 (simulated GPUs)"
	@echo "make test       pytest, ruff, then the labextension's jest tests and linters"
	@echo "make test-lowest  the fast tests and two real-hub ones on the lowest versions we claim"
	@echo "make dist       build the sdist and wheel (with the labextension) into dist/"
	@echo "make lint       ruff check + ruff format --check"
	@echo "make format     ruff check --fix + ruff format"
	@echo "make bench      python -m benchmarks (quick set, ~4 min; FULL=1: the full sizes)"
	@echo "make bench-full python -m benchmarks --full (the sizes docs/benchmarks.md reports)"
	@echo "make venv       create .venv and install -e '.[test,test-torch]' (what make test needs)"
	@echo "make demo-venv  create .venv and install -e '.[demo]' only (what make demo needs)"
	@echo "make node_modules  npm ci (configurable-http-proxy)"
	@echo "make labextension  build the JupyterLab extension and link it into .venv"
	@echo "make clean      remove caches, build output and .demo/ state"
	@echo "make distclean  clean + remove .venv and node_modules"

venv: $(VENV_STAMP)

demo-venv: $(DEMO_STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Editable installs without build isolation (the build backends go into .venv first) and
# without the labextension build hook: the `labextension` target builds and links it. The demo
# gets the runtime extras only; the tests add their tools and PyTorch (a 1.8 GB environment).
define editable_install
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet hatchling editables hatch-jupyter-builder
	SKIP_JUPYTER_BUILDER=1 $(VPY) -m pip install --quiet --no-build-isolation -e ".[$(1)]"
	touch $@
endef

$(DEMO_STAMP): pyproject.toml | $(VPY)
	$(call editable_install,demo)

$(VENV_STAMP): pyproject.toml | $(VPY)
	$(call editable_install,test$(COMMA)test-torch)

node_modules: $(NODE_STAMP)

# npm ci when a lockfile exists (CI and fresh clones get exactly the locked tree).
$(NODE_STAMP): package.json $(wildcard package-lock.json)
	if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; \
	else npm install --no-audit --no-fund; fi
	touch $@

labextension: $(LAB_BUILT)

$(LAB_NODE_STAMP): labextension/package.json labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund
	touch $@

# Built offline against .venv's JupyterLab, then linked into .venv (like an editable install).
$(LAB_BUILT): $(DEMO_STAMP) $(LAB_NODE_STAMP) $(LAB_SOURCES)
	cd labextension && PYTHON=$(abspath $(VPY)) npm run build:prod
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .

demo: demo-venv node_modules labextension
	mkdir -p .demo
	$(VENV)/bin/jupyterhub -f hub_config/jupyterhub_config.py

# pytest-xdist: the real-hub tests mostly wait on hubs, servers and the governor's timers, so
# two workers (a test file each, its module fixtures kept) halve the run on a 2-core machine.
# TEST_WORKERS=0 runs them in this process, one after another. --durations: a run's log names
# its 25 slowest steps and (tests/conftest.py) its longest files, to keep the suite well under
# its 30 minutes and LONGEST_FILES in order.
TEST_WORKERS ?= 2

test: venv node_modules labextension
	$(VPY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd labextension && npm test --silent && npm run lint:check

# The lowest versions the metadata claims (JupyterHub, KubeSpawner, jupyter_server, JupyterLab,
# uvloop, ...: .ci/lowest_constraints.py) in a venv of their own, then the fast tests and two
# real-hub ones (a GPU tier spawned by KubeSpawner under a real hub, governed and culled; a
# spawn's user_options cut where that JupyterHub's ORM saves them, before its hooks), and the
# audit rows the governor makes past SQLAlchemy's constructor stored as the ORM stores them.
LOWEST := .venv-lowest
LOWEST_TESTS := tests/test_tiers.py tests/test_quota.py tests/test_policy.py tests/test_report.py \
	tests/test_backend_choice.py tests/test_kubernetes_files.py tests/test_profiles_kubespawner.py \
	tests/test_server_extension.py tests/test_event_loop.py tests/test_nvml_backend.py \
	tests/test_kubernetes_hub.py::test_a_tier_spawns_a_pod_that_is_governed_and_culled \
	tests/test_config_order.py tests/test_spawn_order_hub.py tests/test_store_audit.py

test-lowest: node_modules labextension
	rm -rf $(LOWEST)
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install --quiet --upgrade pip
	$(LOWEST)/bin/python .ci/lowest_constraints.py > $(LOWEST)/constraints.txt
	$(LOWEST)/bin/python -m pip install --quiet hatchling editables hatch-jupyter-builder
	SKIP_JUPYTER_BUILDER=1 $(LOWEST)/bin/python -m pip install --quiet --no-build-isolation \
		-c $(LOWEST)/constraints.txt -e ".[test]"
	$(LOWEST)/bin/python -m pip list 2>/dev/null | grep -i -E \
		"^(jupyterhub|jupyterhub-kubespawner|jupyter_server|jupyterlab|traitlets|sqlalchemy) "
	PATH="$(abspath $(LOWEST))/bin:$$PATH" $(LOWEST)/bin/jupyter labextension develop --overwrite .
	$(LOWEST)/bin/jupyter labextension list 2>&1 | grep -E "jupyter-gpu-gov .*enabled.*OK"
	$(LOWEST)/bin/jupyter server extension list 2>&1 | grep -E "jupyter_gpu_gov .*enabled"
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider $(LOWEST_TESTS)

# sdist (with the prebuilt labextension) and a wheel built from it, in isolated environments.
dist: labextension
	rm -rf dist
	$(VPY) -m pip install --quiet build
	$(VPY) -m build --outdir dist .

grafana-configmap:
	$(VPY) hub_config/kubernetes/grafana_configmap.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: venv
	$(VPY) -m benchmarks $(if $(FULL),--full)

bench-full: venv
	$(VPY) -m benchmarks --full

clean:
	rm -rf .demo .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -path ./node_modules -prune -o \
		-name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LOWEST) node_modules labextension/node_modules labextension/lib \
		jupyter_gpu_gov/labextension
