#!/usr/bin/env bash
# Build containerd (daemon, runc v2 shim, ctr) from Go modules into a cache outside the
# checkout, one directory per version; the lab packages it as a Debian package for its
# nodes. Idempotent: returns at once when the binaries exist.
#   GPUKIT_CONTAINERD_VERSION=v2.x.y | v1.7.x (make containerd passes the lab's default)
set -euo pipefail
VER="${GPUKIT_CONTAINERD_VERSION:?set GPUKIT_CONTAINERD_VERSION (make containerd does, from gpukit.lab.config)}"
CACHE="${GPUKIT_CACHE:-$HOME/.cache/gpukit}/containerd/$VER"
BINS=(containerd containerd-shim-runc-v2 ctr)
missing=0
for b in "${BINS[@]}"; do [[ -x "$CACHE/bin/$b" ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$CACHE/bin"; exit 0; fi
case "$VER" in
  v2.*) MOD=github.com/containerd/containerd/v2 ;;
  v1.7.*) MOD=github.com/containerd/containerd ;;
  *) echo "GPUKIT_CONTAINERD_VERSION=$VER: the lab builds containerd v1.7.x or v2.x" >&2; exit 2 ;;
esac
mkdir -p "$CACHE/src"
rm -rf "$CACHE/bin.partial"; mkdir -p "$CACHE/bin.partial"
cd "$CACHE/src"
# Static binaries (as containerd's own releases ship the shim): no cgo, so no btrfs or
# devmapper snapshotters, which the lab's overlayfs nodes do not use.
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
[[ -f go.mod ]] || go mod init gpukit.local/containerdbuild >/dev/null 2>&1
cat > tools.go <<GO
//go:build tools
package tools
import (
	_ "$MOD/cmd/containerd"
	_ "$MOD/cmd/containerd-shim-runc-v2"
	_ "$MOD/cmd/ctr"
)
GO
go get "$MOD@$VER" >/dev/null 2>&1
go mod tidy -e >/dev/null 2>&1 || true
LDFLAGS="-s -w -X $MOD/version.Version=$VER -X $MOD/version.Revision=gpukit-lab -X $MOD/version.Package=github.com/containerd/containerd"
for b in "${BINS[@]}"; do
  echo "building $b $VER" >&2
  go build -trimpath -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" -ldflags "$LDFLAGS" \
    -o "$CACHE/bin.partial/$b" "$MOD/cmd/$b"
done
rm -rf "$CACHE/bin"; mv "$CACHE/bin.partial" "$CACHE/bin"
echo "$CACHE/bin"
