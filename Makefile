# gpukit — the README's two commands are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GPUKIT_CACHE ?= $(HOME)/.cache/gpukit

.PHONY: lab test deps venv nvml k8s rootfs protos lab-down clean

lab: deps venv protos nvml k8s rootfs ## bring the lab up (if needed) and run the main job on it
	$(PY) -m gpukit.cli lab up
	$(PY) -m gpukit.cli lab smoke

test: deps venv protos nvml k8s rootfs ## the project's tests: lint, types, unit, lab integration
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p gpukit
	$(PY) -m pytest tests

deps: build/.deps
build/.deps: lab/scripts/install-deps.sh
	bash lab/scripts/install-deps.sh
	@mkdir -p build && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

protos: venv ## gRPC stubs from plugin/api/*.proto (generated at build time, not committed)
	$(PY) -m gpukit.plugin.api.generate

nvml: venv
	$(MAKE) -C lab/nvml PYTHON=$(abspath $(PY)) OUT=$(abspath build/nvml)

k8s: deps
	bash lab/scripts/build-kubernetes.sh >/dev/null

rootfs: deps
	bash lab/scripts/build-rootfs.sh >/dev/null

lab-down: venv
	$(PY) -m gpukit.cli lab down

clean:
	rm -rf build
