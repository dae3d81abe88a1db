"""gpukit.gpu filters for the NVIDIA driver's packages, pins and reboots (gpukit.provision.driver).
Documentation: <filter>.yml beside this file (ansible-doc -t filter gpukit.gpu.<filter>)."""

from __future__ import annotations

from ansible_collections.gpukit.gpu.plugins.plugin_utils import gpukit_filters as gk

driver = gk.library("gpukit.provision.driver")


def _spec(family, branch, kernel_modules, channel, persistenced, version):
    return driver.DriverSpec(branch=str(branch), kernel_modules=kernel_modules, family=family,
                             channel=channel, persistenced=persistenced, version=version or None)


@gk.gpukit_filter
def apt_pin(branch, *, kernel_modules="open", channel="cuda", persistenced=True, version=None):
    return driver.apt_pin(_spec("debian", branch, kernel_modules, channel, persistenced, version))


@gk.gpukit_filter
def dnf_versionlock(branch, *, kernel_modules="open", channel="cuda", persistenced=True,
                    version=None):
    return driver.dnf_versionlock(
        _spec("redhat", branch, kernel_modules, channel, persistenced, version))


@gk.gpukit_filter
def dnf_module_stream(branch, *, kernel_modules="open", channel="cuda", persistenced=True,
                      version=None):
    return driver.dnf_module_stream(
        _spec("redhat", branch, kernel_modules, channel, persistenced, version))


@gk.gpukit_filter
def dnf_stream_switch(module_list, branch, *, kernel_modules="open", channel="cuda",
                      persistenced=True, version=None):
    spec = _spec("redhat", branch, kernel_modules, channel, persistenced, version)
    return driver.dnf_stream_switch(spec, module_list or "")


@gk.gpukit_filter
def driver_packages(branch, family="debian", *, kernel_modules="open", channel="cuda",
                    persistenced=True, version=None):
    return _spec(family, branch, kernel_modules, channel, persistenced, version).packages()


@gk.gpukit_filter
def reboot_decision(target_version, loaded_version, nvml_error=None, nouveau_loaded=False):
    d = driver.reboot_decision(target_version or None, loaded_version or None,
                               nvml_error or None, bool(nouveau_loaded))
    return {"required": d.required, "reason": d.reason}


class FilterModule:
    def filters(self):
        return gk.filter_map(apt_pin, dnf_versionlock, dnf_module_stream, dnf_stream_switch,
                          driver_packages, reboot_decision)
