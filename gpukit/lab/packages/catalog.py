"""The stand-in NVIDIA packages the lab's apt repository serves.

Shaped like a vendor repository, so the roles run the real apt flow (sources, keyring,
branch pin, install, upgrade across branches, conflicts between flavours):

* `nvidia-driver` (one version per branch): the meta package, depending on
  `nvidia-driver-<branch> (= the same version)`.
* `nvidia-driver-<branch>` (`<driver version>-1`): the driver's user space where the real
  driver installs it: `libnvidia-ml.so.<version>` (the mock NVML) and `libcuda.so.<version>`
  (a stand-in built from gpukit/lab/cuda/libcuda.c: cuInit, cuDriverGetVersion, cuDeviceGetCount
  answer from the device nodes the process may open) with their `.so.1` soname links;
  `nvidia-smi` (a binary loading libnvidia-ml.so.1, as the driver's: `-L` answered by it, the
  rest by the lab's nvidia-smi over a vendored pynvml), `nvidia-cuda-mps-control` and
  `nvidia-cuda-mps-server` (gpukit.lab.mps: NVIDIA's MPS interfaces over the mock NVML) and
  a stand-in of `nvidia-debugdump` (it says it is one).
* `nvidia-kernel-open-<branch>`, `nvidia-kernel-<branch>` (`<driver version>-1`): the
  "kernel module", open or proprietary: a unit that "loads" it at boot, and `modprobe`/`rmmod`
  for it (/usr/local/sbin) that load it or unload it (refused while a process holds a
  /dev/nvidia* file, as the kernel's "Module nvidia is in use").
* `nvidia-persistenced` (one version per branch): a persistence daemon stand-in holding the
  daemon's socket, /run/nvidia-persistenced/socket, and its unit.
* `nvidia-container-toolkit` (`1.17.4-1`): `nvidia-container-runtime`, which edits a
  container's OCI spec for its GPUs as NVIDIA's does and runs runc, and `nvidia-cdi-hook`,
  the hooks NVIDIA's CDI specs name (gpukit.lab.runtime).

The loaded "kernel module" decides which driver version the GPUs report (through NVML):
the unit it ships (or its modprobe) rewrites the node's mock NVML profile and
/proc/driver/nvidia/version when it loads. So after an upgrade the old version stays live until
the modules are reloaded or the node reboots, as on a real machine, and meanwhile the new
libnvidia-ml.so.<version> answers nvmlInit with NVML_ERROR_LIB_RM_VERSION_MISMATCH, as the real
library does.

Driver flavours, branches and the meta package conflict the way vendor packages do: the
user-space drivers provide and conflict with `nvidia-driver-binary`, the kernel modules with
`nvidia-kernel-module`, so installing another branch or flavour replaces the old one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpukit.lab.packages import cuda_lib, nvidia_smi_bin
from gpukit.lab.packages.deb import File, Package, symlink, text

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
NVML_LIB_PATH = f"{LIB_DIR}/libnvidia-ml.so.1"
LIBCUDA_PATH = f"{LIB_DIR}/libcuda.so.1"
LAB_DIR = "/usr/lib/nvidia/lab"
TOOLKIT_VERSION = "1.17.4-1"


@dataclass(frozen=True)
class Branch:
    name: str  # "550"
    driver_version: str  # "550.90.07"
    cuda_version: str  # what the driver reports to CUDA: "12.4"

    @property
    def deb_version(self) -> str:
        return f"{self.driver_version}-1"


BRANCHES = (
    Branch("550", "550.90.07", "12.4"),
    Branch("570", "570.86.15", "12.8"),
)

LOAD_MODULE = """\
#!/bin/sh
# Stand-in for loading the NVIDIA kernel module at boot: from now on the node's GPUs
# report the driver version of the module that was installed when the node booted.
set -e
. {lab}/kernel-module
profile=/etc/gpukit-lab/nvml/profile.yaml
if [ -f "$profile" ]; then
  sed -i -e "s/^driver_version:.*/driver_version: \\"$VERSION\\"/" \\
         -e "s/^cuda_driver_version:.*/cuda_driver_version: \\"$CUDA\\"/" \\
         -e "s/^nvml_version:.*/nvml_version: \\"${{CUDA%%.*}}.$VERSION\\"/" "$profile"
fi
# The driver's /proc/driver/nvidia/version names the loaded module (the node's /proc/driver
# shows the mock NVML's state dir, gpukit/lab/node/boot.sh).
version=/var/lib/gpukit-lab/nvml/proc-driver/nvidia/version
if [ -f "$version" ]; then
  sed -i -e "s/Kernel Module  [^ ]*/Kernel Module  $VERSION/" "$version"
fi
mkdir -p /run/nvidia
printf '%s %s\\n' "$VERSION" "$FLAVOUR" > /run/nvidia/module-loaded
"""

# modprobe and rmmod for the stand-in's modules (installed in /usr/local/sbin, ahead of kmod's in
# PATH; any other module goes to kmod). Loading a module that is loaded does nothing, as the
# kernel's; unloading fails while a process holds one of the driver's device files, with kmod's
# words. The lab's device files have no driver behind them on the host (open(2) answers ENXIO),
# so the lab's GPU clients hold them by an O_PATH descriptor: any descriptor of /dev/nvidia*
# counts here, as an open one does for the real module.
MODULE_TOOL = """\
#!/bin/sh
# {tool} (gpukit lab stand-in for the NVIDIA kernel modules; kmod for any other module).
tool={tool}
remove=0; nv=""; other=""
[ "$tool" = rmmod ] && remove=1
for a in "$@"; do
  case "$a" in
    -r|--remove) remove=1 ;;
    -*|*=*) ;;
    nvidia|nvidia_*|nvidia-*) nv="$nv $a" ;;
    *) other="$other $a" ;;
  esac
done
if [ -z "$nv" ]; then exec /usr/sbin/$tool "$@"; fi
if [ -n "$other" ]; then
  echo "$tool: gpukit lab stand-in: NVIDIA modules ($nv) with others ($other)" >&2; exit 1
fi
loaded=/run/nvidia/module-loaded
if [ "$remove" = 0 ]; then
  [ -f "$loaded" ] && exit 0
  exec {lab}/load-module
fi
held=""
for fd in /proc/[0-9]*/fd/*; do
  case "$(readlink "$fd" 2>/dev/null)" in
    /dev/nvidia-uvm*) held="$held nvidia_uvm" ;;
    /dev/nvidia*) held="$held nvidia" ;;
  esac
done
if [ -n "$held" ]; then
  m=nvidia
  case "$held" in *nvidia_uvm*) case "$nv" in *nvidia_uvm*) m=nvidia_uvm ;; esac ;; esac
  if [ "$tool" = rmmod ]; then echo "rmmod: ERROR: Module $m is in use" >&2
  else echo "modprobe: FATAL: Module $m is in use." >&2; fi
  exit 1
fi
# Unloaded (a node not booted since the driver's first install has no record of the load: its
# module counts as loaded, as boot.sh models the driver).
rm -f "$loaded"
"""

LOAD_UNIT = """\
[Unit]
Description=Load the NVIDIA kernel module (gpukit lab stand-in)
Before=containerd.service kubelet.service nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={lab}/load-module

[Install]
WantedBy=multi-user.target
"""

# Debian's convention for "this upgrade needs a reboot" (update-notifier, unattended-upgrades).
REBOOT_REQUIRED = """\
touch /run/reboot-required
grep -qxF "$DPKG_MAINTSCRIPT_PACKAGE" /run/reboot-required.pkgs 2>/dev/null || \\
  echo "$DPKG_MAINTSCRIPT_PACKAGE" >> /run/reboot-required.pkgs
"""

ENABLE_UNIT = """\
if [ "$1" = configure ] && command -v deb-systemd-helper >/dev/null; then
  deb-systemd-helper unmask {unit} >/dev/null || true
  deb-systemd-helper enable {unit} >/dev/null || true
fi
"""

DISABLE_UNIT = """\
if [ "$1" = remove ] || [ "$1" = purge ]; then
  if command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper purge {unit} >/dev/null || true
  fi
fi
"""


PERSISTENCED = """\
#!/bin/sh
# Stand-in for nvidia-persistenced: a real one keeps the GPUs initialised while no client
# holds them and answers on its socket (NVIDIA's CDI specs mount it into containers); this
# one holds the socket and stays up, so its unit behaves like the real service.
exec /usr/bin/python3 -I -c '
import os, signal, socket
path = "/run/nvidia-persistenced/socket"
os.makedirs(os.path.dirname(path), exist_ok=True)
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen()
signal.signal(signal.SIGTERM, lambda *_: (os.unlink(path), os._exit(0)))
# The real daemon keeps the GPUs open, so the driver cannot be unloaded under it (the lab holds
# the device file by an O_PATH descriptor: see MODULE_TOOL).
if os.path.exists("/dev/nvidiactl"):
    ctl = os.open("/dev/nvidiactl", os.O_PATH)
while True:
    s.accept()[0].close()
'
"""

# The driver's other tools NVIDIA's CDI specs mount into containers; the lab's GPUs have no
# coredumps, so this one only says what it is.
STANDIN_TOOL = """\
#!/bin/sh
echo "$(basename "$0"): stand-in of the gpukit lab's NVIDIA driver (no {what})" >&2
exit 1
"""
STANDIN_TOOLS = {
    "nvidia-debugdump": "GPU coredumps",
}

# MPS: gpukit.lab.mps.mps_control (one stdlib-only file) behind both tools' names, as the
# container runtime below ships a Python tool with a launcher. The launcher finds the file
# next to itself, so the tools also run from a mounted driver root (gpukit's MPS control
# container runs <driver root>/usr/bin/nvidia-cuda-mps-control, as it would NVIDIA's binary)
# and needs no shell (that container's image has none).
MPS_SOURCE = Path(__file__).resolve().parent.parent / "mps" / "mps_control.py"
MPS_TOOL = """\
#!/usr/bin/python3 -I
# {tool} (gpukit lab stand-in): NVIDIA's MPS interfaces over the mock NVML.
# See {lab}/mps_control.py.
import os, runpy, sys
here = os.path.dirname(os.path.realpath(__file__))
sys.argv[1:1] = ["{role}"]
runpy.run_path(os.path.join(here, os.path.relpath("{lab}", "/usr/bin"), "mps_control.py"),
               run_name="__main__")
"""
MPS_TOOLS = {"nvidia-cuda-mps-control": "control", "nvidia-cuda-mps-server": "server"}

PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon (gpukit lab stand-in)
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""

# The runtime itself is gpukit.lab.runtime.nvidia_container_runtime (one stdlib-only file);
# the package ships it beside a launcher, as NVIDIA's ships a Go binary.
RUNTIME_SOURCE = Path(__file__).resolve().parent.parent / "runtime" / "nvidia_container_runtime.py"
RUNTIME_DIR = "/usr/lib/nvidia-container-toolkit"
RUNTIME = f"""\
#!/bin/sh
# nvidia-container-runtime (gpukit lab stand-in): edits the OCI spec for the GPUs a container
# asks for, as NVIDIA's does, then runs runc. See {RUNTIME_DIR}/nvidia_container_runtime.py.
exec /usr/bin/python3 -I {RUNTIME_DIR}/nvidia_container_runtime.py "$@"
"""

HOOK_SOURCE = RUNTIME_SOURCE.with_name("nvidia_cdi_hook.py")
CDI_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
CDI_HOOK = f"""\
#!/bin/sh
# nvidia-cdi-hook (gpukit lab stand-in): the OCI hooks NVIDIA's CDI specs name.
# See {RUNTIME_DIR}/nvidia_cdi_hook.py.
exec /usr/bin/python3 -I {RUNTIME_DIR}/nvidia_cdi_hook.py "$@"
"""

RUNTIME_LOG = "/var/log/nvidia-container-runtime.log"
# NVIDIA's packaged config.toml (defaults commented out as there), with the log enabled.
RUNTIME_CONFIG = f"""\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true
#root = "/run/nvidia/driver"

[nvidia-container-runtime]
debug = "{RUNTIME_LOG}"
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
"""


@dataclass(frozen=True)
class Sources:
    """Host files the packages ship."""

    nvml_lib: Path  # the mock libnvidia-ml.so.1
    nvidia_smi: Path  # gpukit/lab/nvidia_smi.py
    pynvml: Path  # pynvml.py (nvidia-ml-py, BSD), vendored for nvidia-smi
    build_dir: Path | None = None  # where the stand-in libcuda is built (None: a temp dir)

    def libcuda(self, branch: Branch) -> Path:
        if self.build_dir is not None:
            return cuda_lib.build(branch.cuda_version, self.build_dir)
        import tempfile

        return cuda_lib.build(branch.cuda_version, Path(tempfile.gettempdir()) / "gpukit-cuda")

    def nvidia_smi_binary(self) -> Path:
        """gpukit/lab/nvidia_smi.c built (-L itself, the rest through nvidia_smi.py)."""
        import tempfile

        out = self.build_dir or Path(tempfile.gettempdir()) / "gpukit-cuda"
        return nvidia_smi_bin.build(out, LAB_DIR)


def driver_packages(branch: Branch, src: Sources) -> list[Package]:
    """The packages of one driver branch."""
    v = branch.deb_version
    b = branch.name
    kernel: list[Package] = []
    flavours = (("open", f"nvidia-kernel-open-{b}"), ("proprietary", f"nvidia-kernel-{b}"))
    for flavour, pkg in flavours:
        kernel.append(
            Package(
                name=pkg,
                version=v,
                section="non-free/kernel",
                description=(
                    f"NVIDIA kernel module, {flavour} flavour, branch {b}\n"
                    "Loaded at boot by nvidia-lab-module.service; the GPUs then report this\n"
                    "driver version."
                ),
                files={
                    f"{LAB_DIR}/kernel-module": text(
                        f'VERSION="{branch.driver_version}"\nCUDA="{branch.cuda_version}"\n'
                        f'FLAVOUR="{flavour}"\n'
                    ),
                    f"{LAB_DIR}/load-module": text(LOAD_MODULE.format(lab=LAB_DIR), 0o755),
                    **{f"/usr/local/sbin/{tool}": text(
                        MODULE_TOOL.format(tool=tool, lab=LAB_DIR), 0o755)
                       for tool in ("modprobe", "rmmod")},
                    "/lib/systemd/system/nvidia-lab-module.service": text(
                        LOAD_UNIT.format(lab=LAB_DIR)
                    ),
                },
                provides=("nvidia-kernel-module",),
                conflicts=("nvidia-kernel-module",),
                replaces=("nvidia-kernel-module",),
                postinst=ENABLE_UNIT.format(unit="nvidia-lab-module.service") + REBOOT_REQUIRED,
                postrm=DISABLE_UNIT.format(unit="nvidia-lab-module.service"),
            )
        )
    userspace = Package(
        name=f"nvidia-driver-{b}",
        version=v,
        description=(
            f"NVIDIA driver user space, branch {b}\n"
            "libnvidia-ml (the gpukit lab's mock NVML), a stand-in libcuda, nvidia-smi."
        ),
        files={
            f"{LIB_DIR}/libnvidia-ml.so.{branch.driver_version}": File(source=src.nvml_lib),
            NVML_LIB_PATH: symlink(f"libnvidia-ml.so.{branch.driver_version}"),
            f"{LIB_DIR}/libcuda.so.{branch.driver_version}": File(source=src.libcuda(branch)),
            LIBCUDA_PATH: symlink(f"libcuda.so.{branch.driver_version}"),
            "/usr/bin/nvidia-smi": File(source=src.nvidia_smi_binary(), mode=0o755),
            **{f"/usr/bin/{tool}": text(STANDIN_TOOL.format(what=what), 0o755)
               for tool, what in STANDIN_TOOLS.items()},
            **{f"/usr/bin/{tool}": text(MPS_TOOL.format(tool=tool, lab=LAB_DIR, role=role), 0o755)
               for tool, role in MPS_TOOLS.items()},
            f"{LAB_DIR}/mps_control.py": File(source=MPS_SOURCE),
            f"{LAB_DIR}/nvidia_smi.py": File(source=src.nvidia_smi),
            f"{LAB_DIR}/pynvml.py": File(source=src.pynvml),
            f"{LAB_DIR}/driver-version": text(branch.driver_version + "\n"),
        },
        depends=(f"nvidia-kernel-open-{b} (= {v}) | nvidia-kernel-{b} (= {v})", "python3"),
        provides=("nvidia-driver-binary",),
        conflicts=("nvidia-driver-binary",),
        replaces=("nvidia-driver-binary",),
        postinst='if [ "$1" = configure ] && command -v ldconfig >/dev/null; then ldconfig; fi\n',
    )
    meta = Package(
        name="nvidia-driver",
        version=v,
        section="non-free/metapackages",
        description=(
            "NVIDIA driver meta package\n"
            "Depends on the newest driver; pin it by version to stay on a branch."
        ),
        depends=(f"nvidia-driver-{b} (= {v})",),
    )
    persistenced = Package(
        name="nvidia-persistenced",
        version=v,
        section="non-free/utils",
        description="NVIDIA persistence daemon",
        files={
            "/usr/bin/nvidia-persistenced": text(PERSISTENCED, 0o755),
            "/lib/systemd/system/nvidia-persistenced.service": text(PERSISTENCED_UNIT),
        },
        postinst=ENABLE_UNIT.format(unit="nvidia-persistenced.service"),
        postrm=DISABLE_UNIT.format(unit="nvidia-persistenced.service"),
    )
    return [*kernel, userspace, meta, persistenced]


def toolkit_packages() -> list[Package]:
    return [
        Package(
            name="nvidia-container-toolkit",
            version=TOOLKIT_VERSION,
            section="non-free/utils",
            description=(
                "NVIDIA container runtime\n"
                "nvidia-container-runtime: adds the GPUs a container asks for (legacy or CDI\n"
                "mode) to its OCI spec, then runs runc; nvidia-cdi-hook, the hooks of CDI\n"
                "specs. CDI specs come from gpukit."
            ),
            files={
                "/usr/bin/nvidia-container-runtime": text(RUNTIME, 0o755),
                f"{RUNTIME_DIR}/nvidia_container_runtime.py": File(source=RUNTIME_SOURCE),
                CDI_HOOK_PATH: text(CDI_HOOK, 0o755),
                f"{RUNTIME_DIR}/nvidia_cdi_hook.py": File(source=HOOK_SOURCE),
                "/etc/nvidia-container-runtime/config.toml": text(RUNTIME_CONFIG, conffile=True),
            },
            depends=("python3 (>= 3.11)", "python3-yaml"),
        )
    ]


def all_packages(src: Sources) -> list[Package]:
    """Every package of the lab repository."""
    out: list[Package] = []
    for branch in BRANCHES:
        out += driver_packages(branch, src)
    out += toolkit_packages()
    return out
