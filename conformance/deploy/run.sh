#!/bin/sh
# Entry point of the in-cluster conformance Job (and of the Sonobuoy plugin): run the suite
# against the cluster this pod runs in, write JUnit XML and the HTML report to $RESULTS_DIR,
# then `done` holding the JUnit path (Sonobuoy's worker waits for that file).
#
# INVENTORY_DIR: a mounted ConfigMap, one key per file: hosts.yml, and group_vars files by
#   their file name (gpu_nodes.yml, ...); rebuilt here into an inventory directory.
# AGENT_IMAGE: gpukit's node-agent image (reads the kubelet's PodResources API on each node).
# CONFORMANCE_ARGS: more pytest arguments (e.g. -m "not workload", --nodes a,b).
set -u
RESULTS_DIR="${RESULTS_DIR:-${SONOBUOY_RESULTS_DIR:-/tmp/results}}"
INVENTORY_DIR="${INVENTORY_DIR:-/inventory}"
NAMESPACE="${CONFORMANCE_NAMESPACE:-gpukit-conformance}"
mkdir -p "$RESULTS_DIR/inventory/group_vars"
cp "$INVENTORY_DIR/hosts.yml" "$RESULTS_DIR/inventory/hosts.yml"
for f in "$INVENTORY_DIR"/*.yml; do
  [ "$(basename "$f")" = hosts.yml ] || cp "$f" "$RESULTS_DIR/inventory/group_vars/"
done
# Host checks need SSH to the nodes: --no-host leaves them (and NVML-on-the-node
# comparisons) to a run from a machine that reaches the nodes.
# shellcheck disable=SC2086
python3 -m pytest --pyargs gpukit.conformance -p no:cacheprovider -rA \
  --inventory "$RESULTS_DIR/inventory" \
  --conformance-namespace "$NAMESPACE" \
  ${AGENT_IMAGE:+--agent-image "$AGENT_IMAGE"} \
  --no-host \
  --junitxml "$RESULTS_DIR/junit.xml" \
  --report-html "$RESULTS_DIR/report.html" \
  ${CONFORMANCE_ARGS:-} 2>&1 | tee "$RESULTS_DIR/pytest.log"
echo "$RESULTS_DIR/junit.xml" > "$RESULTS_DIR/done"
