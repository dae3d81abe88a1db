# gpukit — the README's two commands are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GPUKIT_CACHE ?= $(HOME)/.cache/gpukit

.PHONY: lab provision conformance test deps venv nvml k8s rootfs protos lab-down clean

lab: deps venv protos nvml k8s rootfs ## bring the lab up (if needed) and run the main job on it
	$(PY) -m gpukit.cli lab up
	$(PY) -m gpukit.cli lab smoke
	$(MAKE) provision conformance

provision: venv nvml ## converge the lab's nodes to inventories/lab (ansible-playbook site.yml)
	$(PY) -m gpukit.lab.packages build
	$(VENV)/bin/ansible-playbook -i inventories/lab site.yml

conformance: venv ## prove the lab serves what inventories/lab declares
	@mkdir -p results
	$(PY) -m pytest conformance --inventory inventories/lab \
	  --kubeconfig /var/lib/gpukit-lab/kubeconfig \
	  --junitxml results/conformance.xml --report-html results/conformance.html

test: deps venv protos nvml k8s rootfs ## the project's tests: lint, types, unit, lab integration
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p gpukit
	$(PY) -m gpukit.lab.packages build
	$(PY) -m pytest tests --ignore=tests/conformance --ignore=tests/roles
	# The suite's and the roles' lab tests each reshape a cluster: each gets its own lab.
	GPUKIT_LAB_INSTANCE=1 $(PY) -m pytest tests/conformance
	GPUKIT_LAB_INSTANCE=2 $(PY) -m pytest tests/roles

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
