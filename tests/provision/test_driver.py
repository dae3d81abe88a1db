"""Driver planning: package names per channel, branch pin, exact versions, reboot decisions."""

from __future__ import annotations

import pytest

from gpukit.provision import debversion, driver
from gpukit.provision.driver import DriverSpec, DriverSpecError

MADISON = """\
nvidia-driver | 570.86.15-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-driver | 550.90.07-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-driver-550 | 550.90.07-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-driver-570 | 570.86.15-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-kernel-open-550 | 550.90.07-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-kernel-open-570 | 570.86.15-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-persistenced | 570.86.15-1 | file:/opt/gpukit-lab/apt ./ Packages
nvidia-persistenced | 550.90.07-1 | file:/opt/gpukit-lab/apt ./ Packages
"""


def lab(branch: str = "550", **kw: object) -> DriverSpec:
    return DriverSpec(branch=branch, family="debian", channel="lab", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1.0", "1.0-1", -1), ("1.0~rc1", "1.0", -1), ("550.90.07-1", "570.86.15-1", -1),
        ("550.127.05-1", "550.90.07-1", 1), ("1:1.0", "2.0", 1), ("1.0a", "1.0", 1),
        ("1.0-1", "1.0-1", 0), ("3:550.90.07-1.el9", "550.90.07-1", 1),
    ],
)  # fmt: skip
def test_debian_version_comparison_matches_dpkg(a: str, b: str, expected: int) -> None:
    assert debversion.compare(a, b) == expected
    assert debversion.compare(b, a) == -expected


def test_upstream_and_branch_membership() -> None:
    assert debversion.upstream("3:550.90.07-1.el9") == "550.90.07"
    assert debversion.in_branch("550.90.07-1", "550")
    assert not debversion.in_branch("5500.1-1", "550")
    with pytest.raises(ValueError, match="not a Debian version"):
        debversion.split("not a version")


def test_lab_packages_per_flavour() -> None:
    assert lab().packages() == [
        "nvidia-kernel-open-550", "nvidia-driver", "nvidia-driver-550", "nvidia-persistenced",
    ]  # fmt: skip
    assert lab("570", kernel_modules="proprietary", persistenced=False).packages() == [
        "nvidia-kernel-570", "nvidia-driver", "nvidia-driver-570",
    ]  # fmt: skip


def test_cuda_and_ubuntu_channels() -> None:
    cuda = DriverSpec(branch="550", channel="cuda")
    assert cuda.packages() == ["nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-persistenced"]
    ubuntu = DriverSpec(branch="535", channel="ubuntu", kernel_modules="proprietary")
    assert ubuntu.packages() == ["nvidia-driver-535-server"]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"branch": "55"}, "nvidia_driver_branch: '55' is not a driver branch"),
        ({"branch": "550", "kernel_modules": "closed"}, "nvidia_driver_kernel_modules: 'closed'"),
        ({"branch": "550", "channel": "ubuntu", "family": "redhat"}, "nvidia_driver_channel"),
        ({"branch": "550", "version": "570.86.15"}, "is not in branch"),
        ({"branch": "550", "version": "latest"}, "nvidia_driver_version: 'latest'"),
    ],
)
def test_bad_specs_name_the_variable(kw: dict[str, str], needle: str) -> None:
    with pytest.raises(DriverSpecError, match=needle):
        DriverSpec(**kw)  # type: ignore[arg-type]


def test_pin_covers_the_meta_package_by_version() -> None:
    pin = driver.apt_pin(lab())
    assert "Package: nvidia-driver nvidia-driver-* nvidia-kernel-* nvidia-persistenced\n" in pin
    assert "Pin: version 550.*\n" in pin
    assert "Pin-Priority: 1001\n" in pin
    exact = driver.apt_pin(lab(version="550.90.07"))
    assert "Pin: version 550.90.07-*\n" in exact


def test_parse_madison_sorts_newest_first() -> None:
    out = driver.parse_madison(MADISON)
    assert out["nvidia-driver"] == ["570.86.15-1", "550.90.07-1"]
    assert out["nvidia-driver-550"] == ["550.90.07-1"]


def test_parse_dpkg_query_keeps_installed_packages_only() -> None:
    text = "nvidia-driver 550.90.07-1 ii \nnvidia-driver-550 550.90.07-1 rc \nbash 5.2-2 ii \n"
    assert driver.parse_dpkg_query(text) == {"nvidia-driver": "550.90.07-1", "bash": "5.2-2"}


def test_fresh_install_plans_exact_branch_versions() -> None:
    plan = driver.plan_apt(lab(), {}, driver.parse_madison(MADISON))
    assert plan.install == (
        "nvidia-kernel-open-550=550.90.07-1", "nvidia-driver=550.90.07-1",
        "nvidia-driver-550=550.90.07-1", "nvidia-persistenced=550.90.07-1",
    )  # fmt: skip
    assert plan.driver_version == "550.90.07"
    assert plan.changed and not plan.problems and not plan.remove
    assert plan.summary()[0] == "install nvidia-kernel-open-550 550.90.07-1"


def test_converged_node_plans_nothing() -> None:
    installed = {
        n.split("=")[0]: n.split("=")[1]
        for n in driver.plan_apt(lab(), {}, driver.parse_madison(MADISON)).install
    }
    plan = driver.plan_apt(lab(), installed, driver.parse_madison(MADISON))
    assert not plan.changed and plan.summary() == []


def test_branch_switch_plans_upgrade_and_removal_of_the_old_branch() -> None:
    installed = {
        "nvidia-driver": "550.90.07-1", "nvidia-driver-550": "550.90.07-1",
        "nvidia-kernel-open-550": "550.90.07-1", "nvidia-persistenced": "550.90.07-1",
    }  # fmt: skip
    plan = driver.plan_apt(lab("570"), installed, driver.parse_madison(MADISON))
    assert "nvidia-driver=570.86.15-1" in plan.install
    assert plan.remove == ("nvidia-driver-550", "nvidia-kernel-open-550")
    assert "upgrade nvidia-driver 550.90.07-1 -> 570.86.15-1" in plan.summary()
    assert "remove nvidia-driver-550 550.90.07-1" in plan.summary()
    assert plan.driver_version == "570.86.15"
    back = driver.plan_apt(lab("550"), {"nvidia-driver": "570.86.15-1"},
                           driver.parse_madison(MADISON))  # fmt: skip
    assert "downgrade nvidia-driver 570.86.15-1 -> 550.90.07-1" in back.summary()


def test_missing_versions_are_problems_unless_the_repo_is_not_configured_yet() -> None:
    plan = driver.plan_apt(lab("535"), {}, driver.parse_madison(MADISON))
    assert plan.problems and "nvidia-driver: no version matching 535.*" in plan.problems[1]
    early = driver.plan_apt(lab("535"), {}, {}, repo_configured=False)
    assert not early.problems
    assert early.install[0] == "nvidia-kernel-open-535"
    assert early.summary()[0].endswith("(version resolved after apt update)")


def test_flavour_switch_removes_the_other_kernel_module() -> None:
    installed = {"nvidia-kernel-open-550": "550.90.07-1", "nvidia-driver": "550.90.07-1"}
    plan = driver.plan_apt(
        lab(kernel_modules="proprietary", persistenced=False),
        installed,
        driver.parse_madison(MADISON + "nvidia-kernel-550 | 550.90.07-1 | x\n"),
    )
    assert "nvidia-kernel-550=550.90.07-1" in plan.install
    assert plan.remove == ("nvidia-kernel-open-550",)


def test_dnf_versionlock_and_module_stream() -> None:
    spec = DriverSpec(branch="550", family="redhat", channel="cuda")
    lock = driver.dnf_versionlock(spec)
    assert "nvidia-driver-3:550.*\n" in lock and "kmod-nvidia-open-dkms-3:550.*\n" in lock
    assert driver.dnf_module_stream(spec) == "nvidia-driver:550-open"
    prop = DriverSpec(branch="570", family="redhat", channel="cuda", kernel_modules="proprietary")
    assert driver.dnf_module_stream(prop) == "nvidia-driver:570-dkms"


@pytest.mark.parametrize(
    ("target", "loaded", "error", "nouveau", "required", "needle"),
    [
        ("550.90.07", "550.90.07", None, False, False, "driver 550.90.07 is loaded"),
        ("570.86.15", "550.90.07", None, False, True, "570.86.15 is installed, 550.90.07 is loaded"),
        ("550.90.07", None, "Driver Not Loaded", False, True, "NVML reaches no driver (Driver"),
        ("550.90.07", "550.90.07", None, True, True, "nouveau is loaded"),
        (None, None, None, False, False, "no NVIDIA driver is declared"),
    ],
)  # fmt: skip
def test_reboot_decision(target: str | None, loaded: str | None, error: str | None,
                         nouveau: bool, required: bool, needle: str) -> None:  # fmt: skip
    d = driver.reboot_decision(target, loaded, error, nouveau)
    assert d.required is required and needle in d.reason


DNF_ENABLED = """\
Last metadata expiration check: 0:01:02 ago on Sun 22 Nov 2026 06:00:00 AM UTC.
cuda-rhel9-x86_64
Name           Stream           Profiles                           Summary
nvidia-driver  550-open [e]     default [d], fm, ks, src [i]       Nvidia driver for 550-open branch

Hint: [d]efault, [e]nabled, [x]disabled, [i]nstalled
"""


def test_a_branch_or_flavour_switch_on_dnf_resets_the_module_first() -> None:
    assert driver.dnf_enabled_stream(DNF_ENABLED) == "550-open"
    assert driver.dnf_enabled_stream("") is None
    same = driver.DriverSpec(branch="550", family="redhat", kernel_modules="open")
    other_branch = driver.DriverSpec(branch="570", family="redhat", kernel_modules="open")
    other_flavour = driver.DriverSpec(branch="550", family="redhat", kernel_modules="proprietary")
    assert not driver.dnf_stream_switch(same, DNF_ENABLED)
    assert driver.dnf_stream_switch(other_branch, DNF_ENABLED)
    assert driver.dnf_stream_switch(other_flavour, DNF_ENABLED)
    assert not driver.dnf_stream_switch(other_branch, "")  # nothing enabled yet
