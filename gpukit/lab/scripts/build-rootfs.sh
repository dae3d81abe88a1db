#!/usr/bin/env bash
# Build a Debian root, cached outside the checkout; idempotent. The mirror comes
# from the host's own apt configuration.
#   build-rootfs.sh [node]  the root every lab node boots (systemd, sshd, containerd, runc);
#                           also the base the lab builds the node agent's image from
#                           (python3, python3-venv: gpukit/lab/images.py)
set -euo pipefail
CACHE="${GPUKIT_CACHE:-$HOME/.cache/gpukit}"
SUITE="${GPUKIT_LAB_SUITE:-bookworm}"
FLAVOUR="${1:-node}"
case "$FLAVOUR" in
  node) OUT="$CACHE/rootfs/$SUITE"
        INCLUDE=systemd,systemd-sysv,dbus,libpam-systemd,openssh-server,python3,python3-apt,python3-yaml,python3-venv,iproute2,iputils-ping,runc,containernetworking-plugins,libyaml-0-2,ca-certificates,iptables,kmod,procps,gnupg,sudo,less ;;
  *) echo "unknown flavour $FLAVOUR (node)" >&2; exit 2 ;;
esac
if [[ -f "$OUT/.complete" ]]; then echo "$OUT"; exit 0; fi
mirror="${GPUKIT_LAB_MIRROR:-}"
if [[ -z "$mirror" ]]; then
  mirror=$(python3 - <<'PY'
import glob, re
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    text = open(f).read()
    for stanza in text.split("\n\n"):
        if re.search(r"^Suites:.*\bbookworm\b", stanza, re.M) and "security" not in stanza:
            m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            if m:
                print(m.group(1)); raise SystemExit
for f in ["/etc/apt/sources.list"]:
    try:
        for line in open(f):
            p = line.split()
            if len(p) >= 3 and p[0] == "deb" and "security" not in p[1]:
                print(p[1]); raise SystemExit
    except FileNotFoundError:
        pass
PY
)
fi
if [[ -z "$mirror" ]]; then echo "no Debian mirror found in the host's apt sources; set GPUKIT_LAB_MIRROR" >&2; exit 1; fi
tmp="$OUT.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "debootstrap $SUITE ($FLAVOUR root) from the host's mirror" >&2
log="$CACHE/rootfs/debootstrap-$FLAVOUR.log"
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$tmp" "$mirror" >"$log" 2>&1 || {
  echo "debootstrap failed; see $log" >&2; exit 1; }
# Node-independent tidy-up: no machine-id or host keys baked in (each node gets its own).
rm -f "$tmp/etc/ssh/ssh_host_"* && : > "$tmp/etc/machine-id"
rm -f "$tmp/var/lib/dbus/machine-id"
chroot "$tmp" apt-get clean
rm -rf "$OUT"; mv "$tmp" "$OUT"; touch "$OUT/.complete"
echo "$OUT"
