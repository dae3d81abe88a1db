#!/bin/sh
# Entry point of the in-cluster conformance Job (and of the Sonobuoy plugin): run the suite
# against the cluster this pod runs in, write JUnit XML and the HTML report to $RESULTS_DIR,
# then `done` holding the JUnit path (Sonobuoy's worker waits for that file). The script's
# exit status is the suite's, so the Job fails when a check fails.
#
# INVENTORY_DIR: the inventory, in one of three forms:
#   - a directory tree as Ansible reads it (hosts.yml, group_vars/, host_vars/, nested
#     group_vars/<group>/*.yml included), e.g. from a volume: used as it is;
#   - a ConfigMap holding the key `inventory.tar.gz`: the whole tree as a tarball, made by
#     `tar -C inventories/<fleet> -czf inventory.tar.gz .` (binary data in the ConfigMap);
#   - a flat ConfigMap, one key per file: hosts.yml and group_vars files by their name.
# AGENT_IMAGE: gpukit's node-agent image (reads the kubelet's PodResources API on each node).
# CONFORMANCE_ARGS: more pytest arguments (e.g. -m "not workload", --nodes a,b).
set -u
RESULTS_DIR="${RESULTS_DIR:-${SONOBUOY_RESULTS_DIR:-/tmp/results}}"
INVENTORY_DIR="${INVENTORY_DIR:-/inventory}"
NAMESPACE="${CONFORMANCE_NAMESPACE:-gpukit-conformance}"
INV="$RESULTS_DIR/inventory"
mkdir -p "$INV" || exit 2
if [ -d "$INVENTORY_DIR/group_vars" ] || [ -d "$INVENTORY_DIR/host_vars" ]; then
  # ConfigMap volumes add hidden ..data links: copy what a directory listing shows.
  cp -RL "$INVENTORY_DIR"/. "$INV"/ || exit 2
elif [ -f "$INVENTORY_DIR/inventory.tar.gz" ]; then
  tar -xzf "$INVENTORY_DIR/inventory.tar.gz" -C "$INV" || {
    echo "run.sh: $INVENTORY_DIR/inventory.tar.gz is not a gzip tarball" >&2; exit 2; }
else
  [ -f "$INVENTORY_DIR/hosts.yml" ] || {
    echo "run.sh: no inventory in $INVENTORY_DIR (hosts.yml, group_vars/ or inventory.tar.gz)" >&2
    exit 2; }
  mkdir -p "$INV/group_vars"
  cp "$INVENTORY_DIR/hosts.yml" "$INV/hosts.yml"
  for f in "$INVENTORY_DIR"/*.yml; do
    [ "$(basename "$f")" = hosts.yml ] || cp "$f" "$INV/group_vars/"
  done
fi
# Host checks need SSH to the nodes: --no-host leaves them (and NVML-on-the-node
# comparisons) to a run from a machine that reaches the nodes. The suite's exit status goes
# through a file: in a pipeline, sh reports tee's.
rm -f "$RESULTS_DIR/exit-status"
# shellcheck disable=SC2086
{
  python3 -m pytest --pyargs gpukit.conformance -p no:cacheprovider -rA \
    --inventory "$INV" \
    --conformance-namespace "$NAMESPACE" \
    ${AGENT_IMAGE:+--agent-image "$AGENT_IMAGE"} \
    --no-host \
    --junitxml "$RESULTS_DIR/junit.xml" \
    --report-html "$RESULTS_DIR/report.html" \
    ${CONFORMANCE_ARGS:-} 2>&1
  echo $? > "$RESULTS_DIR/exit-status"
} | tee "$RESULTS_DIR/pytest.log"
status=$(cat "$RESULTS_DIR/exit-status" 2>/dev/null || echo 1)
echo "$RESULTS_DIR/junit.xml" > "$RESULTS_DIR/done"
exit "$status"
