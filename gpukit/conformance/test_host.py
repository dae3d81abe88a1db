"""Host checks over SSH (pytest-testinfra, ansible backend, the same inventory): the driver
answers through NVML with the declared branch, pinned version and GPUs, the container runtime
runs and can hand GPUs to containers, the CDI spec exists when configured, the device plugin
serves its sockets."""

from __future__ import annotations

from typing import Any

import pytest

from gpukit.conformance.checks import Check
from gpukit.conformance.common import need_decl, need_expected, need_host, need_probe
from gpukit.conformance.host import ContainerdView, cdi_kind
from gpukit.conformance.runtime_path import RuntimePath

pytestmark = pytest.mark.host

@pytest.mark.stages("probe")
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


@pytest.mark.stages("probe")
def test_driver_branch(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    if not decl.driver_branch:
        check.skip("declares no nvidia_driver_branch")
    probe = need_probe(gpukit_suite, node)
    check.equal("driver branch (nvmlSystemGetDriverVersion)", decl.driver_branch,
                probe.driver_version.split(".")[0] if probe.driver_version else probe.error)
    check.verify()


@pytest.mark.stages("probe")
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


@pytest.mark.stages("probe", "host")
def test_kernel_driver(gpukit_suite: Any, node: str, check: Check) -> None:
    """The loaded kernel module: its version's branch and flavour (open / proprietary)."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    if probe.mock:
        check.skip(f"NVML here is the gpukit lab mock ({probe.library}): no kernel driver")
    text = gpukit_suite.host_view(node).kernel_version
    check.equal("/proc/driver/nvidia/version", "present",
                "present" if text is not None else "absent (kernel module not loaded)")
    if text is not None:
        if decl.driver_branch:
            check.true("kernel module branch", f" {decl.driver_branch}." in text,
                       decl.driver_branch, text.splitlines()[0] if text else "")
        if decl.kernel_modules:
            flavour = "open" if "Open Kernel Module" in text else "proprietary"
            check.equal("kernel module flavour", decl.kernel_modules, flavour)
    check.verify()


@pytest.mark.stages("host")
def test_container_runtime_running(gpukit_suite: Any, node: str, check: Check) -> None:
    need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    view = gpukit_suite.host_view(node)
    check.equal(f"{view.service} service", "running",
                "running" if view.service_running else "not running")
    check.equal(f"{view.service} service enabled", True, view.service_enabled)
    check.verify()


@pytest.mark.stages("probe", "host")
def test_runtime_configured_for_nvidia(gpukit_suite: Any, node: str, check: Check) -> None:
    """The runtime can hand the device plugin's devices to containers: CDI enabled for the CDI
    strategies; for envvar/volume-mounts the NVIDIA runtime (real GPUs) or device specs."""
    decl = need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    probe = need_probe(gpukit_suite, node)
    host = gpukit_suite.host_view(node)
    plugin = decl.plugin_config.flags.plugin
    strategies = set(plugin.device_list_strategy)
    view = host.containerd
    if decl.container_runtime == "containerd":
        if not isinstance(view, ContainerdView):
            check.equal("containerd's effective config", "readable", view)
            check.verify()
            return
        if strategies & {"cdi-annotations", "cdi-cri"}:
            check.equal("containerd CDI (enable_cdi, containerd config dump)", True,
                        view.enable_cdi)  # fmt: skip
        nvidia_runtime = bool(view.nvidia_runtimes)
        # Everywhere, the lab's mock included: pods reach the NVIDIA runtime through a handler
        # of containerd's effective config, named by a RuntimeClass unless it is the default.
        check.true("containerd runtime handlers running the NVIDIA runtime (config dump)",
                   nvidia_runtime, "at least one", "none")
        if nvidia_runtime and view.default_runtime not in view.nvidia_runtimes:
            classes = {n: h for n, h in gpukit_suite.kube.runtime_classes().items()
                       if h in view.nvidia_runtimes}
            check.true("a RuntimeClass with an NVIDIA runtime handler (default runtime "
                       f"{view.default_runtime!r})", bool(classes),
                       f"handler one of {list(view.nvidia_runtimes)}",
                       ", ".join(f"{n} -> {h}" for n, h in sorted(classes.items())) or "none")
    else:
        nvidia_runtime = "nvidia-container-runtime" in host.runtime_config
    if strategies & {"envvar", "volume-mounts"}:
        if probe.mock:
            check.equal("devices reach containers as DeviceSpecs (passDeviceSpecs, lab mock)",
                        True, plugin.pass_device_specs)
        else:
            if decl.container_runtime != "containerd":
                check.equal("NVIDIA container runtime configured", True, nvidia_runtime)
            if nvidia_runtime and decl.container_runtime == "containerd":
                assert isinstance(view, ContainerdView)
                check.true("the NVIDIA runtime is containerd's default (containerd config dump)",
                           view.default_runtime in view.nvidia_runtimes, view.nvidia_runtimes,
                           f"default_runtime_name is {view.default_runtime!r}")  # fmt: skip
    check.verify()


@pytest.mark.stages("host")
def test_declared_runtime_path(gpukit_suite: Any, node: str, check: Check) -> None:
    """Users' GPU pods reach the NVIDIA runtime as the inventory declares (role
    container_toolkit): its RuntimeClass exists with the runtime as handler, and the node's
    effective containerd config has that handler running the NVIDIA runtime, as the default
    where declared so. The suite's own pods take that route (conformance.runtime_path)."""
    decl = need_decl(gpukit_suite, node)
    path: RuntimePath = gpukit_suite.runtime_paths[node]
    if path.runtime_class:
        classes = gpukit_suite.kube.runtime_classes()
        check.equal(f"RuntimeClass {path.runtime_class!r} handler (container_toolkit_"
                    "runtime_class)", path.runtime_name,
                    classes.get(path.runtime_class, "no such RuntimeClass"))
    else:
        check.true(f"runtime {path.runtime_name!r} the default (container_toolkit_runtime_"
                   "class is empty: no RuntimeClass names it)", path.default,
                   "container_toolkit_set_as_default true", "false")
    need_host(gpukit_suite, node)
    view = gpukit_suite.host_view(node).containerd
    if decl.container_runtime == "containerd":
        if not isinstance(view, ContainerdView):
            check.equal("containerd's effective config", "readable", view)
            check.verify()
            return
        check.true(f"containerd runtime handler {path.runtime_name!r} running the NVIDIA "
                   "runtime (config dump)", path.runtime_name in view.nvidia_runtimes,
                   "present", list(view.nvidia_runtimes) or "none")
        if path.default:
            check.equal("containerd's default runtime (container_toolkit_set_as_default, "
                        "config dump)", path.runtime_name, view.default_runtime)
    check.verify()


@pytest.mark.stages("host")
def test_cdi_spec_present(gpukit_suite: Any, node: str, check: Check) -> None:
    decl = need_decl(gpukit_suite, node)
    if decl.dra:  # the DRA plugin writes one spec per prepared claim (the dra area checks it)
        check.skip("not served by the device plugin (gpukit_gpu_allocation: dra)")
    need_host(gpukit_suite, node)
    strategies = set(decl.plugin_config.flags.plugin.device_list_strategy)
    if not strategies & {"cdi-annotations", "cdi-cri"}:
        check.skip(f"config {decl.plugin_config_name!r} uses {sorted(strategies)}: no CDI spec "
                   "expected")
    view = gpukit_suite.host_view(node)
    kinds = list(view.cdi_kinds or ())
    kind = cdi_kind(decl)
    check.true(f"CDI spec of kind {kind}", kind in kinds, f"a spec in {list(view.cdi_dirs)}",
               kinds or "none")
    check.verify()


@pytest.mark.stages("host")
def test_device_plugin_serves_its_sockets(gpukit_suite: Any, node: str, check: Check) -> None:
    """One listening socket per declared resource in the kubelet's device-plugins directory."""
    need_decl(gpukit_suite, node)
    need_host(gpukit_suite, node)
    expected = need_expected(gpukit_suite, node)
    sockets = gpukit_suite.host_view(node).sockets
    for resource in expected:
        path, state = sockets[resource]
        check.equal(f"device plugin socket {path}", "listening", state, resource)
    check.verify()
