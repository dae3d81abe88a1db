#!/usr/bin/env bash
# Build NVIDIA's k8s-device-plugin and GPU Feature Discovery, unmodified, from their Go
# module (github.com/NVIDIA/k8s-device-plugin, GFD is cmd/gpu-feature-discovery of it) into
# a cache outside the checkout, for the peer lab (`make peer`). Idempotent: returns at once
# when both binaries exist. CGO stays on: go-nvml dlopens libnvidia-ml.so.1 at run time,
# which on the lab is the mock NVML the node image carries.
set -euo pipefail
VER="${GPUKIT_NVIDIA_PLUGIN_VERSION:-v0.19.0}"
CACHE="${GPUKIT_CACHE:-$HOME/.cache/gpukit}/nvidia-device-plugin/$VER"
BINS=(nvidia-device-plugin gpu-feature-discovery)
missing=0
for b in "${BINS[@]}"; do [[ -x "$CACHE/bin/$b" ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$CACHE/bin"; exit 0; fi
mkdir -p "$CACHE/src" "$CACHE/bin.partial"
cd "$CACHE/src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=1 PATH="/usr/local/go/bin:$PATH"
MOD=github.com/NVIDIA/k8s-device-plugin
# A throwaway consumer module pins the release; the module's own go.sum checks its deps.
if [[ ! -f go.mod ]]; then go mod init gpukit.local/nvidiapluginbuild >/dev/null 2>&1; fi
cat > tools.go <<GO
//go:build tools
package tools
import (
	_ "$MOD/cmd/nvidia-device-plugin"
	_ "$MOD/cmd/gpu-feature-discovery"
)
GO
go get "$MOD@$VER" >/dev/null 2>&1 || go get "$MOD@$VER"
go mod tidy -e >/dev/null 2>&1 || true
for b in "${BINS[@]}"; do
  echo "building $b $VER" >&2
  go build -trimpath -ldflags "-s -w -X $MOD/internal/info.version=$VER" \
    -o "$CACHE/bin.partial/$b" "$MOD/cmd/$b"
done
rm -rf "$CACHE/bin"; mv "$CACHE/bin.partial" "$CACHE/bin"
echo "$CACHE/bin"
