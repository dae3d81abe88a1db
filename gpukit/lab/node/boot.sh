#!/usr/bin/env bash
# A lab node's init, stage one. Runs as PID 1 of the node's own PID, mount, UTS,
# IPC and cgroup namespaces (inside its network namespace), builds the node's
# view of the system (/proc, /sys, cgroups, /dev, /run), pivots into the node's
# root and executes systemd. Not a security boundary: a lab only.
set -euo pipefail
NODE=$1 ROOT=$2 SHARED=$3 GPUS=$4

mount --make-rprivate /
hostname "$NODE"
mount --bind "$ROOT" "$ROOT"
cd "$ROOT"

mount -t proc -o nosuid,nodev,noexec proc proc
# Kernel tunables are not namespaced: the node may read them, never change them.
mount --bind proc/sys proc/sys
mount -o remount,bind,ro proc/sys
mount -t sysfs -o nosuid,nodev,noexec sysfs sys

# cgroups: mounted inside the cgroup namespace, each hierarchy's root is the node's subtree.
mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs sys/fs/cgroup
while read -r fstype opts dir; do
  mkdir -p "sys/fs/cgroup/$dir"
  mount -t "$fstype" -o "nosuid,nodev,noexec,$opts" "$fstype" "sys/fs/cgroup/$dir"
done < "$SHARED/cgroup-mounts"

# A minimal /dev, plus the node's GPU device files (the driver is modelled as loaded).
mount -t tmpfs -o mode=755,nosuid tmpfs dev
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  IFS=: read -r n ma mi <<<"$d"; mknod -m 666 "dev/$n" c "$ma" "$mi"
done
mkdir -p dev/pts dev/shm dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts dev/pts
ln -s pts/ptmx dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs dev/shm
mount -t mqueue mqueue dev/mqueue 2>/dev/null || true
ln -s /proc/self/fd dev/fd
ln -s /proc/self/fd/0 dev/stdin; ln -s /proc/self/fd/1 dev/stdout; ln -s /proc/self/fd/2 dev/stderr
# The kubelet's OOM watcher reads /dev/kmsg.
if [[ -c /dev/kmsg ]]; then touch dev/kmsg; mount --bind /dev/kmsg dev/kmsg; else ln -s null dev/kmsg; fi
# cAdvisor (in the kubelet) needs the block device under the node's root to size the filesystems.
src=$(findmnt -n -o SOURCE --target "$ROOT" | sed 's/\[.*//')
if [[ -b "$src" && "$src" == /dev/* ]]; then
  mkdir -p "dev/$(dirname "${src#/dev/}")"
  mknod -m 600 "dev/${src#/dev/}" b "$((0x$(stat -c %t "$src")))" "$((0x$(stat -c %T "$src")))"
fi
for ((i = 0; i < GPUS; i++)); do mknod -m 666 "dev/nvidia$i" c 195 "$i"; done
if ((GPUS > 0)); then
  mknod -m 666 dev/nvidiactl c 195 255
  mknod -m 666 dev/nvidia-modeset c 195 254
  mknod -m 666 dev/nvidia-uvm c 510 0
  mknod -m 666 dev/nvidia-uvm-tools c 510 1
fi

# The stand-in driver's surface (gpukit.lab.driver_surface): what the kernel and the driver
# show GPU consumers. Hardware views rendered by `lab up` beside the node's root, read-only:
# PCI sysfs (the node's GPUs only), DMI, /dev/nvidia-caps (major in driver_surface.CAPS_MAJOR).
SURFACE=$(dirname "$ROOT")/driver
ro_bind() { mount --bind "$1" "$2"; mount -o remount,bind,ro "$2"; }
# overlay SRC DST MERGE: the sysfs directory DST shows SRC's entries (read-only) in place of its
# own of the same name, and its other entries as they were: a tmpfs of bind mounts (sysfs
# cannot mkdir). MERGE=1: a directory both have is overlaid the same way (the node's PCI host
# bridge pci0000:00 beside the machine's devices on it), one level only.
overlay() {
  local src=$1 dst=$2 merge=$3 keep c n
  keep=$(mktemp -d "$ROOT/dev/.sys.XXXXXX")
  mount --bind "$dst" "$keep"
  mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs "$dst"
  for c in "$keep"/*; do
    n=${c##*/}
    [[ -e $c || -L $c ]] || continue
    if [[ -e $src/$n ]] && ! ((merge)) || [[ -e $src/$n && (-L $c || ! -d $c) ]]; then
      continue  # SRC's replaces it (or, merging, is overlaid on it below)
    fi
    if [[ -L $c ]]; then cp -P "$c" "$dst/$n"; continue; fi
    if [[ -d $c ]]; then mkdir "$dst/$n"; else touch "$dst/$n"; fi
    mount --bind "$c" "$dst/$n"
  done
  for c in "$src"/*; do
    n=${c##*/}
    [[ -e $c ]] || continue
    if [[ -d $dst/$n && ! -L $dst/$n ]]; then overlay "$c" "$dst/$n" 0; continue; fi
    mkdir "$dst/$n"
    ro_bind "$c" "$dst/$n"
  done
  mount -o remount,ro "$dst"
  umount "$keep"
  rmdir "$keep"
}
# The GPUs' devices as a kernel lays them out, /sys/devices/pci<domain>:<bus>/.../<bus id>,
# which the bus's links (/sys/bus/pci/{devices,drivers/nvidia}/<bus id>) point to.
if [[ -d $SURFACE/sys/devices ]]; then
  overlay "$SURFACE/sys/devices" sys/devices 1
fi
for d in devices drivers; do
  if [[ -d $SURFACE/sys/bus/pci/$d && -d sys/bus/pci/$d ]]; then
    ro_bind "$SURFACE/sys/bus/pci/$d" "sys/bus/pci/$d"
  fi
done
if [[ -d $SURFACE/sys/class/dmi/id ]]; then
  # sysfs has no /sys/class/dmi here (and cannot mkdir): a tmpfs /sys/class holding the
  # kernel's classes (bind mounts) and the node's dmi/id.
  mkdir dev/.sysclass
  mount --bind sys/class dev/.sysclass
  mount -t tmpfs -o mode=755,nosuid,nodev,noexec tmpfs sys/class
  for c in dev/.sysclass/*; do
    [[ ${c##*/} == dmi ]] && continue
    mkdir "sys/class/${c##*/}"
    mount --bind "$c" "sys/class/${c##*/}"
  done
  mkdir -p sys/class/dmi/id
  ro_bind "$SURFACE/sys/class/dmi/id" sys/class/dmi/id
  mount -o remount,ro sys/class
  umount dev/.sysclass
  rmdir dev/.sysclass
fi
if [[ -d $SURFACE/dev/nvidia-caps ]]; then
  mkdir dev/nvidia-caps
  ro_bind "$SURFACE/dev/nvidia-caps" dev/nvidia-caps
fi
# /proc/driver: the driver's files, kept by the mock NVML in its state dir (written at boot from
# the profile and state; the capability files after every MIG change, by any NVML client): live.
NVSTATE=var/lib/gpukit-lab/nvml
if [[ -d proc/driver ]]; then
  mkdir -p "$NVSTATE/proc-driver"
  ro_bind "$NVSTATE/proc-driver" proc/driver
fi

mount -t tmpfs -o mode=755,nosuid,nodev tmpfs run
mkdir -p run/lock
# Binaries and images the lab built, shared read-only by every node.
mkdir -p opt/gpukit-lab
mount --bind "$SHARED" opt/gpukit-lab
mount -o remount,bind,ro opt/gpukit-lab

mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
# Shared within the node (as systemd makes a real host's /), so the kubelet can give
# containers HostToContainer propagation; the node's namespace keeps it off the host.
mount --make-rshared /
exec env -i container=lab container_uuid="$(cat /etc/machine-id)" TERM=dumb /lib/systemd/systemd --log-target=journal-or-kmsg
