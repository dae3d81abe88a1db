"""Host checks over SSH (pytest-testinfra, ansible backend, the same inventory): the driver
answers through NVML with the declared branch, pinned version and GPUs, the container runtime
runs and can hand GPUs to containers, the CDI spec exists when configured, the device plugin
serves its sockets."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.common import need_decl, need_expected, need_host, need_probe
from gpukit.contracts import label_names as ln

pytestmark = pytest.mark.host

RUNTIME_SERVICES = {"containerd": "containerd", "crio": "crio"}
RUNTIME_CONFIGS = {
    "containerd": ["/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml"],
    "crio": ["/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*"],
}
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def test_nvml_answers_with_the_declared_gpus(gpukit_suite: Any, node: str,
                                             check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    check.equal("NVML answers", "ok", "ok" if probe.ok else probe.error)
    check.equal("GPU count", decl.gpu.count, len(probe.gpus))  # lost GPUs count, as in NVML
    for g in probe.gpus:
        if g.error:  # by its own index; the GPUs after it are compared below as usual
            check.equal(f"GPU {g.index}", "present", g.state)
    readable = probe.readable
    check.equal("GPU products", [decl.gpu.product] * len(readable), [g.name for g in readable])
    if decl.gpu.memory_mib:
        check.equal("GPU memory (MiB)", [decl.gpu.memory_mib] * len(readable),
                    [g.memory_mib for g in readable])
    check.verify()


def test_driver_branch(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    if not decl.driver_branch:
        check.skip("declares no nvidia_driver_branch")
    probe = need_probe(gpukit_suite, node)
    check.equal("driver branch (nvmlSystemGetDriverVersion)", decl.driver_branch,
                probe.driver_version.split(".")[0] if probe.driver_version else probe.error)
    check.verify()


def test_driver_version(gpukit_suite: Any, node: str, check: Check) -> None:
    """The exact version `nvidia_driver_version` pins. The inventory model refuses a version
    outside the declared branch, so this never contradicts test_driver_branch."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    if not decl.driver_version:
        check.skip("pins no nvidia_driver_version (the newest of its branch is not checked)")
    probe = need_probe(gpukit_suite, node)
    check.equal("driver version (nvmlSystemGetDriverVersion)", decl.driver_version,
                probe.driver_version or probe.error)
    check.verify()


def test_kernel_driver(gpukit_suite: Any, node: str, check: Check) -> None:
    """The loaded kernel module: its version's branch and flavour (open / proprietary)."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    if probe.mock:
        check.skip(f"NVML here is the gpukit lab mock ({probe.library}): no kernel driver")
    host = gpukit_suite.host(node)
    version = host.file("/proc/driver/nvidia/version")
    check.equal("/proc/driver/nvidia/version", "present",
                "present" if version.exists else "absent (kernel module not loaded)")
    if version.exists:
        text = version.content_string
        if decl.driver_branch:
            check.true("kernel module branch", f" {decl.driver_branch}." in text,
                       decl.driver_branch, text.splitlines()[0] if text else "")
        if decl.kernel_modules:
            flavour = "open" if "Open Kernel Module" in text else "proprietary"
            check.equal("kernel module flavour", decl.kernel_modules, flavour)
    check.verify()


def test_container_runtime_running(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    host = gpukit_suite.host(node)
    svc = host.service(RUNTIME_SERVICES[decl.container_runtime])
    check.equal(f"{svc.name} service", "running", "running" if svc.is_running else "not running")
    check.equal(f"{svc.name} service enabled", True, bool(svc.is_enabled))
    check.verify()


def _runtime_config(host: Any, runtime: str) -> str:
    paths = " ".join(RUNTIME_CONFIGS[runtime])
    return str(host.run(f"cat {paths} 2>/dev/null").stdout)


# containerd's CRI runtime settings: config version 3 (containerd 2) and version 2 (1.x).
CRI_RUNTIME_TABLES = ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri")


@dataclass(frozen=True)
class ContainerdView:
    """What containerd itself says it runs with (`containerd config dump`: the files merged,
    imports applied, defaults filled in), not what one file says."""

    enable_cdi: bool
    nvidia_runtimes: tuple[str, ...]  # runtimes whose BinaryName is the NVIDIA runtime
    default_runtime: str


def _containerd_view(host: Any) -> ContainerdView | str:
    """The effective CRI settings, or why they cannot be read."""
    out = host.run("containerd config dump")
    if out.rc != 0:
        return f"`containerd config dump` failed: {(out.stderr or out.stdout).strip()[:200]}"
    try:
        plugins = tomllib.loads(out.stdout).get("plugins", {})
    except tomllib.TOMLDecodeError as e:
        return f"`containerd config dump` is not TOML: {e}"
    cri = next((plugins[k] for k in CRI_RUNTIME_TABLES if k in plugins), None)
    if not isinstance(cri, dict):
        return "`containerd config dump` has no CRI runtime plugin"
    runtimes = (cri.get("containerd") or {}).get("runtimes") or {}
    nvidia = tuple(sorted(
        name for name, rt in runtimes.items()
        if str(((rt or {}).get("options") or {}).get("BinaryName", "")).endswith(
            "nvidia-container-runtime")
    ))  # fmt: skip
    return ContainerdView(enable_cdi=cri.get("enable_cdi") is True, nvidia_runtimes=nvidia,
                          default_runtime=str((cri.get("containerd") or {}).get(
                              "default_runtime_name", "")))  # fmt: skip


def test_runtime_configured_for_nvidia(gpukit_suite: Any, node: str, check: Check) -> None:
    """The runtime can hand the device plugin's devices to containers: CDI enabled for the CDI
    strategies; for envvar/volume-mounts the NVIDIA runtime (real GPUs) or device specs."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    host = gpukit_suite.host(node)
    plugin = decl.plugin_config.flags.plugin
    strategies = set(plugin.device_list_strategy)
    if decl.container_runtime == "containerd":
        view = _containerd_view(host)
        if isinstance(view, str):
            check.equal("containerd's effective config", "readable", view)
            check.verify()
            return
        if strategies & {"cdi-annotations", "cdi-cri"}:
            check.equal("containerd CDI (enable_cdi, containerd config dump)", True,
                        view.enable_cdi)  # fmt: skip
        nvidia_runtime = bool(view.nvidia_runtimes)
    else:
        nvidia_runtime = "nvidia-container-runtime" in _runtime_config(host, "crio")
    if strategies & {"envvar", "volume-mounts"}:
        if probe.mock:
            check.equal("devices reach containers as DeviceSpecs (passDeviceSpecs, lab mock)",
                        True, plugin.pass_device_specs)
        else:
            check.equal("NVIDIA container runtime configured", True, nvidia_runtime)
            if nvidia_runtime and decl.container_runtime == "containerd":
                assert not isinstance(view, str)
                check.true("the NVIDIA runtime is containerd's default (containerd config dump)",
                           view.default_runtime in view.nvidia_runtimes, view.nvidia_runtimes,
                           f"default_runtime_name is {view.default_runtime!r}")  # fmt: skip
    check.verify()


def test_cdi_spec_present(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    strategies = set(decl.plugin_config.flags.plugin.device_list_strategy)
    if not strategies & {"cdi-annotations", "cdi-cri"}:
        check.skip(f"config {decl.plugin_config_name!r} uses {sorted(strategies)}: no CDI spec "
                   "expected")
    host = gpukit_suite.host(node)
    dirs = sorted({*CDI_DIRS, decl.plugin_config.gpukit.cdi_spec_dir})
    out = host.run("cat " + " ".join(f"{shlex.quote(d)}/*.json" for d in dirs) + " 2>/dev/null")
    kinds: list[str] = []
    for chunk in out.stdout.replace("}\n{", "}\0{").split("\0"):
        try:
            kinds.append(str(json.loads(chunk).get("kind", "")))
        except ValueError:
            continue
    check.true("CDI spec of kind nvidia.com/gpu", ln.GPU_RESOURCE in kinds,
               f"a spec in {dirs}", kinds or "none")
    check.verify()


def test_device_plugin_serves_its_sockets(gpukit_suite: Any, node: str, check: Check) -> None:
    """One listening socket per declared resource in the kubelet's device-plugins directory."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    expected = need_expected(gpukit_suite, node)
    host = gpukit_suite.host(node)
    base = decl.plugin_config.gpukit.kubelet_dir.rstrip("/")
    listening = str(host.run("ss -xlH 2>/dev/null").stdout)
    for resource in expected:
        path = f"{base}/gpukit-{resource.partition('/')[2]}.sock"
        f = host.file(path)
        state = "listening" if f.exists and f.is_socket and path in listening.replace(
            "///", "/").replace("//", "/") else ("present, not listening" if f.exists
                                                 else "absent")
        check.equal(f"device plugin socket {path}", "listening", state, resource)
    check.verify()
