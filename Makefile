# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned so pip takes the CPU wheel; a newer or unpinned torch pulls gigabytes of CUDA packages.
TORCH ?= torch==2.13.0
# Third-party BNN libraries the importers are tested against. Their layers need only torch: --no-deps.
BNN_LIBS ?= bayesian-torch==0.5.0 torchbnn==1.2 blitz-bayesian-pytorch==0.2.8
# laplace-torch and the pure-Python packages it imports, --no-deps: it lists torchvision (no CPU wheel here),
# which it never imports, and pip must not replace the pinned torch.
LAPLACE_LIBS ?= laplace-torch==0.3 asdfghjkl==0.1a4 backpack-for-pytorch==1.7.1 curvlinops-for-pytorch==3.0.1 \
	einops==0.8.2 unfoldNd==0.2.3 einconv==0.1.0 linear-operator==0.6.1 opt-einsum==3.4.0 torchmetrics==1.9.0 \
	lightning-utilities==0.15.3

.PHONY: install demo test test-fast lint bench fuzz clean device-check

# An example plug-in package (examples/plugin): installed so its entry points load in every command and test.
PLUGIN_EXAMPLE ?= examples/plugin

$(STAMP): pyproject.toml $(PLUGIN_EXAMPLE)/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[torch,dev,search,tensorrt]'
	$(PY) -m pip install -q --no-deps $(BNN_LIBS)
	$(PY) -m pip install -q --no-deps $(LAPLACE_LIBS)
	$(PY) -m pip install -q --no-deps -e $(PLUGIN_EXAMPLE)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgebnn demo --out demo-out

# The linters: ruff, mypy, and the import layers of docs/design.md.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p edgebnn
	$(VENV)/bin/lint-imports

# Everything (what CI runs): the linters, then every test (unit, integration, reliability; device tests skip
# without their hardware), in TEST_WORKERS processes (pytest-xdist), each test file in one process so its
# fixtures are built once: a serial run keeps about one of two cores busy.
TEST_WORKERS ?= 2
test: lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20

# The unit lane while working: no training, no CLI subprocesses, no full chains (those are in tests/integration).
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit --durations=10

# On a machine with an NVIDIA GPU and a CUDA build of torch (no TensorRT needed; needs no venv: the system python's
# torch, onnx, onnxruntime and nvidia-ml-py): every mode through the torch CUDA runner vs the float baselines, NVML
# energy, numerics vs onnxruntime CPU. One JSON (DEVICE_CHECK_OUT). 35 s on an H100.
DEVICE_CHECK_OUT ?= device_check.json
device-check:
	PYTHONPATH=. python3 bench/device_check.py --out $(DEVICE_CHECK_OUT)

# Fuzz every loader with FUZZ_MUTANTS corrupted files (random seed unless FUZZ_SEED=N; printed, so a run
# repeats with it); failing mutants are kept in fuzz-out/ for a regression case (tests/fuzz/regressions/).
FUZZ_MUTANTS ?= 10000
FUZZ_SEED ?=
FUZZ_WORKERS ?=
fuzz: $(STAMP)
	$(PY) tests/fuzz/campaign.py --mutants $(FUZZ_MUTANTS) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED)) \
		$(if $(FUZZ_WORKERS),--workers $(FUZZ_WORKERS)) --keep fuzz-out --json fuzz-out/summary.json

bench: $(STAMP)
	$(PY) bench/compression.py

clean:
	rm -rf $(VENV) demo-out fuzz-out .pytest_cache .ruff_cache
