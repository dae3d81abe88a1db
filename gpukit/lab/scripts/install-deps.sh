#!/usr/bin/env bash
# Host packages the lab and the tests need (Debian). Idempotent.
set -euo pipefail
# buildah builds the node agent's image from the Containerfile (gpukit/lab/images.py).
PKGS=(busybox-static file dpkg-dev apt-utils gnupg debootstrap etcd-server iproute2 iptables libyaml-dev gcc make openssl psmisc util-linux buildah)
PKGS+=(prometheus)  # promtool: tests check the shipped alert rules and dashboard queries (deploy/monitoring)
# The lab's OCI registry (gpukit/lab/registry.py): the agent image copied to it (skopeo),
# pulled from it by the nodes' containerd.
PKGS+=(docker-registry skopeo)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing host packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
