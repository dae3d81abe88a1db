#!/usr/bin/env bash
# Build the Kubernetes control plane and kubelet from Go modules into a cache
# outside the checkout. Idempotent: returns at once when the binaries exist.
set -euo pipefail
VER="${GPUKIT_K8S_VERSION:?set GPUKIT_K8S_VERSION (make k8s does, from gpukit.lab.config)}"
CACHE="${GPUKIT_CACHE:-$HOME/.cache/gpukit}/kubernetes/$VER"
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
missing=0
for b in "${BINS[@]}"; do [[ -x "$CACHE/bin/$b" ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$CACHE/bin"; exit 0; fi
mkdir -p "$CACHE/src" "$CACHE/bin.partial"
cd "$CACHE/src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
if [[ ! -f go.mod ]]; then
  go mod init gpukit.local/k8sbuild >/dev/null 2>&1
fi
# k8s.io/kubernetes replaces its staging modules with local paths; a consumer
# maps each one to the published module at the matching v0.x version.
gomod=$(go mod download -json "k8s.io/kubernetes@$VER" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
staging_ver="v0.${VER#v1.}"
{
  echo "require k8s.io/kubernetes $VER"
  grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging_ver" '{print "replace " $1 " => " $1 " " v}'
} > replaces.txt
cat > go.mod <<GOMOD
module gpukit.local/k8sbuild

go 1.24

$(cat replaces.txt)
GOMOD
cat > tools.go <<'GO'
//go:build tools
package tools
import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
go mod tidy -e >/dev/null 2>&1 || true
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$VER -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$VER" | cut -d. -f2)"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  echo "building $b $VER" >&2
  go build -trimpath -ldflags "$LDFLAGS" -o "$CACHE/bin.partial/$b" "k8s.io/kubernetes/cmd/$b"
done
echo "building kubectl $VER" >&2
go build -trimpath -ldflags "$LDFLAGS" -o "$CACHE/bin.partial/kubectl" "k8s.io/kubernetes/cmd/kubectl"
rm -rf "$CACHE/bin"; mv "$CACHE/bin.partial" "$CACHE/bin"
echo "$CACHE/bin"
