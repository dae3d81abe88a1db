"""NVIDIA's GPU architectures, as NVML codes them and as NVIDIA's tools spell them: one table.

- NVML's `nvmlDeviceGetArchitecture` code -> gpukit's name (what discovery records);
- that name -> the spelling go-nvlib's GetArchitectureAsString gives, which NVIDIA's DRA driver
  publishes as the `architecture` attribute (selectors match it unchanged);
- GPU feature discovery's `nvidia.com/gpu.family` label, which GFD derives from the CUDA compute
  capability instead (so Ada is `ada-lovelace` there, and 12.x Blackwell parts `blackwell`), as
  GFD v0.20.0's getArchFamily (internal/lm/resource.go) does, 13.x `rubin` included.
"""

from __future__ import annotations

# (NVML code, name, NVIDIA's spelling)
_TABLE = (
    (2, "kepler", "Kepler"), (3, "maxwell", "Maxwell"), (4, "pascal", "Pascal"),
    (5, "volta", "Volta"), (6, "turing", "Turing"), (7, "ampere", "Ampere"),
    (8, "ada", "Ada Lovelace"), (9, "hopper", "Hopper"), (10, "blackwell", "Blackwell"),
)
BY_NVML_CODE = {code: name for code, name, _ in _TABLE}
DISPLAY = {name: display for _, name, display in _TABLE}
# GFD's family by compute capability major (7.x and 8.x split by minor: gfd_family).
_GFD_FAMILY = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper",
               10: "blackwell", 12: "blackwell", 13: "rubin"}


def from_nvml(code: int) -> str:
    """gpukit's name for an NVML architecture code; "" for a code this table lacks (left out,
    not guessed)."""
    return BY_NVML_CODE.get(code, "")


def display_name(name: str) -> str:
    """NVIDIA's spelling (DRA `architecture` attribute) of gpukit's name."""
    return DISPLAY.get(name, name.capitalize())


def gfd_family(major: int, minor: int) -> str:
    """GFD's `nvidia.com/gpu.family` from the CUDA compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _GFD_FAMILY.get(major, "undefined")
