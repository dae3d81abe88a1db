"""Host checks over SSH (pytest-testinfra, ansible backend, the same inventory): the driver
answers through NVML with the declared branch and GPUs, the container runtime runs and can hand
GPUs to containers, the CDI spec exists when configured, the device plugin serves its sockets."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.common import need_decl, need_expected, need_host, need_probe

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
    check.equal("GPU count", decl.gpu.count, len(probe.gpus))
    check.equal("GPU products", [decl.gpu.product] * decl.gpu.count,
                [g.name for g in probe.gpus])
    if decl.gpu.memory_mib:
        check.equal("GPU memory (MiB)", [decl.gpu.memory_mib] * decl.gpu.count,
                    [g.memory_mib for g in probe.gpus])
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


def test_runtime_configured_for_nvidia(gpukit_suite: Any, node: str, check: Check) -> None:
    """The runtime can hand the device plugin's devices to containers: CDI enabled for the CDI
    strategies; for envvar/volume-mounts the NVIDIA runtime (real GPUs) or device specs."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    host = gpukit_suite.host(node)
    cfg = _runtime_config(host, decl.container_runtime)
    plugin = decl.plugin_config.flags.plugin
    strategies = set(plugin.device_list_strategy)
    compact = cfg.replace(" ", "")
    if strategies & {"cdi-annotations", "cdi-cri"} and decl.container_runtime == "containerd":
        check.equal("containerd CDI (enable_cdi)", True, "enable_cdi=true" in compact)
    if strategies & {"envvar", "volume-mounts"}:
        nvidia_runtime = "nvidia-container-runtime" in cfg
        if probe.mock:
            check.equal("devices reach containers as DeviceSpecs (passDeviceSpecs, lab mock)",
                        True, plugin.pass_device_specs)
        else:
            check.equal("NVIDIA container runtime configured", True, nvidia_runtime)
            if nvidia_runtime and decl.container_runtime == "containerd":
                check.true("nvidia is the default runtime (or pods use its RuntimeClass)",
                           'default_runtime_name="nvidia"' in compact
                           or "runtime_class" in cfg.lower(), "nvidia",
                           "default_runtime_name is not nvidia")
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
    check.true("CDI spec of kind nvidia.com/gpu", "nvidia.com/gpu" in kinds,
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
