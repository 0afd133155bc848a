# gpuyard — every target creates .venv and installs what it needs on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint bench bench-small format clean compose-check deploy crds k8s-bin plot

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## the demo on the embedded fake cluster at http://127.0.0.1:8080 (GPUYARD__SERVER__PORT=N for another port)
	$(BIN)/gpuyard demo

plot: $(STAMP)  ## matplotlib (the `plot` extra) in .venv, for the PNG plots of `gpuyard simulate openb|replay`
	$(BIN)/python -m pip install --quiet -e '.[dev,plot]'

TEST_WORKERS ?= auto
test: $(STAMP)  ## the whole test suite, in one process per core (at most 4; TEST_WORKERS=0 for one process)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadgroup

lint: $(STAMP)  ## ruff + import-linter layer contracts + mypy (configured in pyproject.toml)
	$(BIN)/ruff check gpuyard tests bench
	$(BIN)/ruff format --check gpuyard tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix gpuyard tests bench
	$(BIN)/ruff format gpuyard tests bench

k8s-bin:  ## the real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) from Kubernetes' Go modules, cached outside the repo ($$GPUYARD_K8S_BIN overrides the folder)
	@hack/k8s/build.sh

bench: $(STAMP)  ## benchmarks; each prints JSON figures
	@mkdir -p bench/out
	@for b in bench/*.py; do echo "== $$b" >&2; $(BIN)/python $$b || exit 1; done

bench-small: $(STAMP)  ## CI-sized benchmark runs
	@for b in bench/*.py; do echo "== $$b" >&2; $(BIN)/python $$b --small || exit 1; done

compose-check:  ## validate docker-compose.yml where a docker client exists
	@if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then \
		docker compose -f docker-compose.yml config -q && echo "docker-compose.yml: ok"; \
	else echo "compose-check: skipped (no docker compose client)"; fi

.PHONY: gpu-check
gpu-check:  ## on a machine with an NVIDIA GPU: discovery, agent --once --print, a health watch, the MPS memory-limit check (hack/gpu-check.sh; skips without a GPU; not part of test or bench)
	@hack/gpu-check.sh

deploy: $(STAMP)  ## regenerate configs/deploy/ (CRDs from the models, manifests) after a model change
	$(BIN)/gpuyard install --write-crds configs/deploy/crds --write-manifests configs/deploy

crds: deploy

clean:
	rm -rf $(VENV) .gpuyard build *.egg-info
