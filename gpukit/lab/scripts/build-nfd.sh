#!/usr/bin/env bash
# Build Node Feature Discovery (nfd-master, nfd-worker), unmodified, from its Go module
# (sigs.k8s.io/node-feature-discovery) into a cache outside the checkout: what turns GPU
# Feature Discovery's features file into node labels, as NVIDIA's own deployment does (the
# peer lab, `make peer`). Idempotent: returns at once when both binaries exist.
set -euo pipefail
VER="${GPUKIT_NFD_VERSION:-v0.17.3}"
CACHE="${GPUKIT_CACHE:-$HOME/.cache/gpukit}/node-feature-discovery/$VER"
BINS=(nfd-master nfd-worker)
missing=0
for b in "${BINS[@]}"; do [[ -x "$CACHE/bin/$b" ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$CACHE/bin"; exit 0; fi
mkdir -p "$CACHE/src" "$CACHE/bin.partial"
cd "$CACHE/src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 PATH="/usr/local/go/bin:$PATH"
MOD=sigs.k8s.io/node-feature-discovery
# The module replaces k8s.io/kubernetes' staging modules by published versions; a consumer
# module must repeat those replace directives (Go honours only the main module's), its own
# API module (a local path there) mapped to the published one of the same version.
gomod=$(go mod download -json "$MOD@$VER" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module gpukit.local/nfdbuild"
  echo
  echo "go 1.24"
  echo
  echo "require $MOD $VER"
  sed -n '/^replace (/,/^)/p' "$gomod" | sed -E "s#^(\s*(\S+)) => \./\S+\$#\1 => \2 $VER#"
} > go.mod
cat > tools.go <<GO
//go:build tools
package tools
import (
	_ "$MOD/cmd/nfd-master"
	_ "$MOD/cmd/nfd-worker"
)
GO
go mod tidy -e >/dev/null 2>&1 || true
for b in "${BINS[@]}"; do
  echo "building $b $VER" >&2
  go build -trimpath -ldflags "-s -w -X $MOD/pkg/version.version=$VER" \
    -o "$CACHE/bin.partial/$b" "$MOD/cmd/$b"
done
rm -rf "$CACHE/bin"; mv "$CACHE/bin.partial" "$CACHE/bin"
echo "$CACHE/bin"
