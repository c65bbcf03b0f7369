# fedtune: `make run` (set up + main job), `make test` (set up + tests). See README.md.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
CONFIG ?=
# one simulated SuperNode per client of the (preset's) capacity profile, one CPU each
FEDERATION ?= num-supernodes=$$($(BIN)/python -m fedtune_app.tools.config_info num-clients '$(CONFIG)') client-resources-num-cpus=1
RESULTS ?= $(CURDIR)/results

# Flower writes its state here; no telemetry, no update checks, and never let the SuperLink
# `uv sync` the app's dependencies from the network (it would pull another torch).
export FLWR_HOME := $(CURDIR)/.flwr
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export RAY_DEDUP_LOGS := 0
export PATH := $(BIN):$(PATH)

.PHONY: setup run test notebooks bench clean stop

# pip (not uv): pip takes the local torch/torchvision wheels of STACK.md.
$(VENV)/.installed: requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	@# Fashion-MNIST for the offline vision presets and `python -m fedtune_app.tools.pretrain` (best effort)
	@dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || { apt-get update -qq && \
	    apt-get install -y -qq dataset-fashion-mnist >/dev/null; } || \
	    echo "note: Debian package dataset-fashion-mnist not installed (only the Fashion-MNIST presets need it)"
	@touch $@

setup: $(VENV)/.installed

run: setup
	@mkdir -p "$(RESULTS)" "$(FLWR_HOME)"
	@set -o pipefail; $(BIN)/flwr run . --stream \
	    --federation-config "$(FEDERATION)" \
	    --run-config 'results-dir="$(RESULTS)" $(CONFIG)' 2>&1 | tee .flwr/last-run.log; \
	    status=$$?; $(MAKE) -s stop; \
	    folder=$$(grep -o 'RESULTS .*' .flwr/last-run.log | tail -1 | cut -d' ' -f2); \
	    test $$status -eq 0 -a -n "$$folder" || { echo "run failed (log: .flwr/last-run.log)"; exit 1; }; \
	    echo "$$folder"

# one torch thread per test process: tiny models gain little from more, and on a machine whose
# cores other jobs also use, OpenMP's busy threads slow runs down 20-80x
test: setup
	$(BIN)/ruff check --quiet .
	$(BIN)/lint-imports --no-cache --no-logo
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

# The strategy-comparison notebooks, executed headless on a tiny preset (outputs not committed).
NOTEBOOK_PRESET ?= smoke
notebooks: setup
	$(BIN)/python -m fedtune_app.tools.notebook_runner notebooks/*.ipynb --preset "$(NOTEBOOK_PRESET)" --out $(RESULTS)/notebooks

# Performance measurements (not tests): bytes, layer scaling, simulation vs plain loop, memory.
bench: setup
	$(BIN)/python benchmarks/bench_bytes.py
	$(BIN)/python benchmarks/bench_layers.py --threads 1
	$(BIN)/python benchmarks/bench_simulation.py

# `flwr run` leaves a detached local SuperLink (and its simulation) running: stop ours.
stop:
	@$(BIN)/python -m fedtune_app.tools.local_superlink stop "$(FLWR_HOME)"

clean:
	rm -rf $(VENV) .flwr results
