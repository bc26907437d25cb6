# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned so pip takes the CPU wheel; a newer or unpinned torch pulls gigabytes of CUDA packages.
TORCH ?= torch==2.13.0
# Third-party BNN libraries the importers are tested against. Their layers need only torch: --no-deps.
BNN_LIBS ?= bayesian-torch==0.5.0 torchbnn==1.2 blitz-bayesian-pytorch==0.2.8

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[torch,dev,search]'
	$(PY) -m pip install -q --no-deps $(BNN_LIBS)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgebnn demo --out demo-out

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p edgebnn
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(PY) bench/compression.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache
