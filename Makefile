# gpukit — the README's two commands are `make lab` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GPUKIT_CACHE ?= $(HOME)/.cache/gpukit

.PHONY: lab peer provision conformance evidence test lint unit matrix scale hardware deps venv nvml k8s containerd rootfs protos lab-down clean dist

# The running lab instance (GPUKIT_LAB_INSTANCE, default 0): its inventory (instance 0:
# inventories/lab; others: a copy with their addresses) and kubeconfig.
LAB_INVENTORY = $(PY) -c 'from gpukit.lab.config import load_spec; from gpukit.lab.inventory import for_instance; print(for_instance(load_spec()))'
LAB_KUBECONFIG = $(PY) -c 'from gpukit.lab.controlplane import paths; print(paths().admin_kubeconfig)'
RESULTS ?= results
# provision and conformance print their part of the summary; lab prints the whole at its end.
SUMMARY ?= 1

lab: deps venv protos nvml k8s containerd rootfs ## bring the lab up (if needed) and run the main job on it
	$(PY) -m gpukit.cli lab up
	$(PY) -m gpukit.cli lab smoke
	@rm -f $(RESULTS)/site.json $(RESULTS)/conformance.xml
	@$(MAKE) --no-print-directory provision conformance SUMMARY=0; rc=$$?; \
	  $(PY) -m gpukit.summary --play $(RESULTS)/site.json --junit $(RESULTS)/conformance.xml; \
	  exit $$rc

provision: venv nvml ## converge the lab's nodes to its inventory (ansible-playbook site.yml)
	$(PY) -m gpukit.lab.packages build
	@mkdir -p $(RESULTS) && rm -f $(RESULTS)/site.json
	@inv=$$($(LAB_INVENTORY)) || exit; \
	  echo "ansible-playbook -i $$inv site.yml  (results: $(RESULTS)/site.json)"; \
	  ANSIBLE_CALLBACKS_ENABLED=gpukit.gpu.play_record$${ANSIBLE_CALLBACKS_ENABLED:+,$$ANSIBLE_CALLBACKS_ENABLED} \
	  GPUKIT_PLAY_RECORD=$(RESULTS)/site.json $(VENV)/bin/ansible-playbook -i "$$inv" site.yml; \
	  rc=$$?; [ "$(SUMMARY)" = 0 ] || $(PY) -m gpukit.summary --play $(RESULTS)/site.json; exit $$rc

conformance: venv ## prove the lab serves what its inventory declares
	@mkdir -p $(RESULTS) && rm -f $(RESULTS)/conformance.xml
	@inv=$$($(LAB_INVENTORY)) && kc=$$($(LAB_KUBECONFIG)) || exit; \
	  echo "pytest gpukit/conformance --inventory $$inv --kubeconfig $$kc"; \
	  $(PY) -m pytest gpukit/conformance --inventory "$$inv" --kubeconfig "$$kc" \
	    --junitxml $(RESULTS)/conformance.xml --report-html $(RESULTS)/conformance.html; \
	  rc=$$?; [ "$(SUMMARY)" = 0 ] || $(PY) -m gpukit.summary --junit $(RESULTS)/conformance.xml; \
	  exit $$rc

evidence: venv ## CNCF AI Conformance evidence of the suite on the lab: junit.xml, e2e.log, PRODUCT.yaml
	@mkdir -p $(RESULTS)/evidence
	@inv=$$($(LAB_INVENTORY)) && kc=$$($(LAB_KUBECONFIG)) || exit; \
	  $(PY) -m pytest gpukit/conformance --inventory "$$inv" --kubeconfig "$$kc" \
	    --junitxml $(RESULTS)/evidence/junit.xml 2>&1 | tee $(RESULTS)/evidence/e2e.log; \
	  rc=$${PIPESTATUS[0]}; \
	  $(PY) -m gpukit evidence $(RESULTS)/evidence/junit.xml -o $(RESULTS)/evidence \
	    --log $(RESULTS)/evidence/e2e.log --platform-name gpukit \
	    --kubernetes-version "$$($(PY) -c 'import sys; from kubernetes import client, config; config.load_kube_config(sys.argv[1]); v = client.VersionApi().get_code(); print(f"v{v.major}.{v.minor}")' "$$kc")"; \
	  exit $$rc

# The three lab instances `make test` uses: the suite's and the roles' lab tests each
# reshape a cluster, so each part gets its own lab (override to run beside other labs).
# Not instance 0: that is the lab `make lab` brings up, provisions and leaves up, and the
# tests expect labs of their own, not one site.yml has labelled and deployed to.
TEST_LABS ?= 1 2 3

# Two lanes side by side (the roles' lab tests, mostly waiting on reboots and rollouts,
# take as long as everything else; a third lane for the rolling upgrades was tried and
# gained nothing on 2 cores): lane 1 runs everything but the roles' tests, then the
# suite's tests, then the sharing-config rollout's lab test on the suite's lab (each part
# also when an earlier one failed); lane 2 the other roles' tests, then the version matrix
# (`make matrix`, below). Each lane's output goes to $(RESULTS)/test-lane<N>.log and is
# printed when both are done.
SHARING_LAB_TEST = tests/roles/test_upgrade_sharing_lab.py
test: deps venv protos nvml k8s containerd rootfs ## the project's tests: lint, types, unit, lab integration
	@# The matrix's stack, built before the lanes start (the runtime tests also judge config
	@# edits with the real containerd of both config versions).
	GPUKIT_CONTAINERD_VERSION=$(MATRIX_CONTAINERD) bash gpukit/lab/scripts/build-containerd.sh >/dev/null
	GPUKIT_K8S_VERSION=$(MATRIX_K8S) bash gpukit/lab/scripts/build-kubernetes.sh >/dev/null
	@$(MAKE) --no-print-directory lint
	@# The test labs start from new nodes, as on a new machine: node roots outlive `lab down`,
	@# and what an earlier run left on them (a pinned driver branch, an upgrade) is not the
	@# bare node the tests provision from.
	for i in $(TEST_LABS) $(MATRIX_LAB); do \
	  GPUKIT_LAB_INSTANCE=$$i $(PY) -m gpukit.cli lab down --purge || exit; done
	@mkdir -p $(RESULTS); set -- $(TEST_LABS); \
	  for i in $$1 $$2 $$3; do GPUKIT_LAB_INSTANCE=$$i $(PY) -m gpukit.lab.packages build || exit; done; \
	  ( GPUKIT_LAB_INSTANCE=$$1 $(PY) -m pytest tests --ignore=tests/conformance --ignore=tests/roles; \
	    a=$$?; GPUKIT_LAB_INSTANCE=$$2 $(PY) -m pytest tests/conformance; b=$$?; \
	    GPUKIT_LAB_INSTANCE=$$2 $(PY) -m pytest $(SHARING_LAB_TEST); c=$$?; \
	    [ $$a = 0 ] && [ $$b = 0 ] && [ $$c = 0 ] ) > $(RESULTS)/test-lane1.log 2>&1 & lane1=$$!; \
	  ( GPUKIT_LAB_INSTANCE=$$3 $(PY) -m pytest tests/roles --ignore=$(SHARING_LAB_TEST); \
	    d=$$?; $(MAKE) --no-print-directory matrix; e=$$?; [ $$d = 0 ] && [ $$e = 0 ] ) \
	    > $(RESULTS)/test-lane2.log 2>&1; rc2=$$?; \
	  wait $$lane1; rc1=$$?; \
	  for lane in 1 2; do echo "===== lane $$lane ($(RESULTS)/test-lane$$lane.log)"; \
	    cat $(RESULTS)/test-lane$$lane.log; done; \
	  echo "lane 1 (unit, lab, suite): exit $$rc1; lane 2 (roles, matrix): exit $$rc2"; \
	  [ $$rc1 = 0 ] && [ $$rc2 = 0 ]

# Fast checks that need no lab cluster (`make test` runs them too, before the lab lanes):
# lint is ruff and mypy strict; unit is every test not marked `lab` (the containerd config
# tests build the containerd releases they judge edits with, once, into $(GPUKIT_CACHE)).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p gpukit

unit: venv protos nvml
	$(PY) -m pytest tests -m "not lab" -q

# The version matrix beside the default stack (`make test` runs it in lane 2): the main job on the
# oldest supported Kubernetes with containerd 1.7 (config version 2), on a lab instance of
# its own: lab up, smoke, site.yml, the conformance suite, then a second site.yml that must
# change nothing; the lab is taken down afterwards, also when a step failed, and the verdicts
# are printed last (the second run's after the first's: CI shows the end of the output).
MATRIX_K8S ?= v1.35.4
MATRIX_CONTAINERD ?= v1.7.35
MATRIX_LAB ?= 4
matrix: deps venv protos nvml rootfs
	@export GPUKIT_K8S_VERSION=$(MATRIX_K8S) GPUKIT_CONTAINERD_VERSION=$(MATRIX_CONTAINERD) \
	    GPUKIT_LAB_INSTANCE=$(MATRIX_LAB); \
	  echo "== matrix: Kubernetes $(MATRIX_K8S), containerd $(MATRIX_CONTAINERD), lab $(MATRIX_LAB)"; \
	  $(MAKE) --no-print-directory k8s containerd || exit; rm -f $(RESULTS)/matrix-rerun/site.json; \
	  $(PY) -m gpukit.cli lab up && $(PY) -m gpukit.cli lab status && $(PY) -m gpukit.cli lab smoke \
	  && $(MAKE) --no-print-directory provision conformance RESULTS=$(RESULTS)/matrix SUMMARY=0 \
	  && $(MAKE) --no-print-directory provision RESULTS=$(RESULTS)/matrix-rerun SUMMARY=0; rc=$$?; \
	  $(PY) -m gpukit.cli lab down; \
	  $(PY) -m gpukit.summary --play $(RESULTS)/matrix/site.json --junit $(RESULTS)/matrix/conformance.xml; \
	  if [ -f $(RESULTS)/matrix-rerun/site.json ]; then echo "== matrix: the second site.yml (changes nothing)"; \
	    $(PY) -m gpukit.summary --play $(RESULTS)/matrix-rerun/site.json --unchanged || rc=1; fi; \
	  echo "matrix (Kubernetes $(MATRIX_K8S), containerd $(MATRIX_CONTAINERD)): exit $$rc"; exit $$rc

# Fleet scale (not in `make test`: about 20 minutes): the suite on a 4-node lab of mixed profiles,
# sequential and with nodes worked in parallel (the same report both ways, wall times printed),
# upgrade.yml on that lab (50% serial: two batches of two; a failed node stops the rollout
# before a batch that could pass the failure budget), then a simulated fleet of API-only nodes
# on a control plane of its own; benchmarks/fleet_scale.py prints time and memory against node
# count, benchmarks/site_scale.py site.yml's per node count and forks.
SCALE_LAB ?= 8
SCALE_FLEET_LAB ?= 9
SCALE_NODES ?= gpu-a100=a100-sxm4-40gb-x8,gpu-t4=t4-x2,gpu-h100=h100-80gb-x8,gpu-a100-80=a100-80gb-x4
scale: deps venv protos nvml k8s containerd rootfs
	GPUKIT_LAB_INSTANCE=$(SCALE_LAB) GPUKIT_LAB_NODES=$(SCALE_NODES) $(PY) -m gpukit.lab.packages build
	GPUKIT_LAB_INSTANCE=$(SCALE_LAB) GPUKIT_LAB_NODES=$(SCALE_NODES) \
	  $(PY) -m pytest tests/conformance/test_lab_parallel.py -s; rc=$$?; \
	  GPUKIT_LAB_INSTANCE=$(SCALE_LAB) GPUKIT_LAB_NODES=$(SCALE_NODES) \
	  $(PY) -m pytest tests/roles/test_upgrade_scale_lab.py -s; rc3=$$?; \
	  GPUKIT_LAB_INSTANCE=$(SCALE_LAB) GPUKIT_LAB_NODES=$(SCALE_NODES) $(PY) -m gpukit.cli lab down; \
	  GPUKIT_LAB_INSTANCE=$(SCALE_FLEET_LAB) $(PY) -m pytest tests/lab/test_fleet_lab.py; rc2=$$?; \
	  [ $$rc = 0 ] && [ $$rc2 = 0 ] && [ $$rc3 = 0 ]

# The peer lane (not in `make test`: about 20 minutes on 2 cores): one GPU node (PEER_HOST) served
# by NVIDIA's own k8s-device-plugin and GPU Feature Discovery (gpukit.lab.peer: built unmodified
# from their Go module, with NFD's master for GFD's labels) instead of gpukit's agent, on a lab of
# its own: lab up, NVIDIA's stack on the node with the config the inventory selects for it,
# site.yml with the peer inventory (the node declared gpukit_node_agent: false), the conformance
# suite; the lab is taken down afterwards, also when a step failed (PEER_KEEP=1 leaves it up).
PEER_LAB ?= 5
PEER_HOST ?= gpu-t4
peer: deps venv protos nvml k8s containerd rootfs ## the suite against NVIDIA's device plugin + GFD on one node
	@export GPUKIT_LAB_INSTANCE=$(PEER_LAB) GPUKIT_LAB_PEER=$(PEER_HOST); start=$$(date +%s); \
	  mkdir -p $(RESULTS)/peer && rm -f $(RESULTS)/peer/site.json $(RESULTS)/peer/conformance.xml; \
	  $(PY) -m gpukit.lab.packages build && $(PY) -m gpukit.cli lab up && $(PY) -m gpukit.lab.peer image \
	  && inv=$$($(PY) -m gpukit.lab.peer inventory) && kc=$$($(LAB_KUBECONFIG)) \
	  && $(PY) -m gpukit.lab.peer deploy \
	  && ANSIBLE_CALLBACKS_ENABLED=gpukit.gpu.play_record GPUKIT_PLAY_RECORD=$(RESULTS)/peer/site.json \
	    $(VENV)/bin/ansible-playbook -i "$$inv" site.yml && $(PY) -m gpukit.lab.peer wait \
	  && $(PY) -m pytest gpukit/conformance --inventory "$$inv" --kubeconfig "$$kc" \
	    --junitxml $(RESULTS)/peer/conformance.xml; rc=$$?; \
	  [ "$(PEER_KEEP)" = 1 ] || $(PY) -m gpukit.cli lab down; \
	  $(PY) -m gpukit.summary --play $(RESULTS)/peer/site.json --junit $(RESULTS)/peer/conformance.xml; \
	  echo "peer ($(PEER_HOST) on NVIDIA's stack, lab $(PEER_LAB)): exit $$rc, $$(( $$(date +%s) - start )) s"; \
	  exit $$rc

# On a machine with a real NVIDIA GPU and driver (not collected by `make test`): gpukit's
# discovery, labels, facts and device plugin against the driver, and the driver's NVML answers
# recorded for the mock's fidelity test (tests/lab/nvml/test_fidelity.py).
hardware: venv protos
	mkdir -p $(RESULTS) && GPUKIT_HARDWARE=1 GPUKIT_FIDELITY_OUT=$(RESULTS)/nvml-record.json \
	  $(PY) -m pytest tests/hardware -v --junitxml=$(RESULTS)/hardware.xml

deps: build/.deps
build/.deps: gpukit/lab/scripts/install-deps.sh
	bash gpukit/lab/scripts/install-deps.sh
	@mkdir -p build && touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

protos: venv ## gRPC stubs from gpukit/plugin/api/*.proto (generated at build time, not committed)
	$(PY) -m gpukit.plugin.api.generate

nvml: venv
	$(MAKE) -C gpukit/lab/nvml PYTHON=$(abspath $(PY)) OUT=$(abspath build/nvml)

# The lab's stack (gpukit.lab.config: its defaults, or GPUKIT_K8S_VERSION and
# GPUKIT_CONTAINERD_VERSION), each built once per version into $(GPUKIT_CACHE).
LAB_VERSION = $(PY) -c 'import sys; from gpukit.lab import config as c; c.check_versions(c.K8S_VERSION, c.CONTAINERD_VERSION); print(getattr(c, sys.argv[1]))'
k8s: deps venv
	@v=$$($(LAB_VERSION) K8S_VERSION) || exit; GPUKIT_K8S_VERSION=$$v bash gpukit/lab/scripts/build-kubernetes.sh >/dev/null

containerd: deps venv
	@v=$$($(LAB_VERSION) CONTAINERD_VERSION) || exit; GPUKIT_CONTAINERD_VERSION=$$v bash gpukit/lab/scripts/build-containerd.sh >/dev/null

rootfs: deps
	bash gpukit/lab/scripts/build-rootfs.sh >/dev/null

# A release into $(DIST): the wheel, the sdist, the collection tarball and the agent image as
# an OCI archive, all of pyproject.toml's version (deploy/release.py check refuses a galaxy.yml
# or CHANGELOG.md that disagrees), and SHA256SUMS. The image is built from the Containerfile
# as anyone outside the lab builds it (README "Releasing"); DIST_IMAGE=0 leaves it out,
# DIST_BASE names another Debian bookworm base (one with python3 and python3-venv needs no
# package index).
DIST ?= dist
DIST_IMAGE ?= 1
DIST_BASE ?= debian:bookworm-slim
BUILDAH ?= buildah
DIST_BUILD_FLAGS ?=
dist: venv protos ## a release into dist/: wheel, sdist, collection, agent image (OCI archive), SHA256SUMS
	$(PY) deploy/release.py check
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(PY) deploy/release.py build $(DIST)
	@if [ "$(DIST_IMAGE)" = 1 ]; then \
	  ref=$$($(PY) deploy/release.py image) && v=$$($(PY) deploy/release.py version) || exit; \
	  set -x; \
	  $(BUILDAH) bud --isolation chroot --layers $(DIST_BUILD_FLAGS) -f Containerfile -t "$$ref" \
	    --build-arg BASE=$(DIST_BASE) --build-arg REVISION=$$(git rev-parse HEAD) . && \
	  $(BUILDAH) push "$$ref" "oci-archive:$(DIST)/gpukit-node-agent-$$v.oci.tar:$$ref"; \
	fi
	$(PY) deploy/release.py sums $(DIST)
	cd $(DIST) && sha256sum -c --quiet SHA256SUMS

lab-down: venv
	$(PY) -m gpukit.cli lab down

clean:
	rm -rf build
