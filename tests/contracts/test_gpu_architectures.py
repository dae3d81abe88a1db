"""NVIDIA's GPU architectures in one table: NVML's codes, NVIDIA's spellings, GFD's family."""

from __future__ import annotations

import pytest

from gpukit.contracts import gpu_architectures as ga


@pytest.mark.parametrize(("code", "name", "display"), [
    (6, "turing", "Turing"), (7, "ampere", "Ampere"), (8, "ada", "Ada Lovelace"),
    (9, "hopper", "Hopper"), (10, "blackwell", "Blackwell")])
def test_nvml_codes_and_nvidias_spelling(code: int, name: str, display: str) -> None:
    assert ga.from_nvml(code) == name
    assert ga.display_name(name) == display


def test_a_code_the_table_lacks_is_left_out() -> None:
    assert ga.from_nvml(99) == ""


@pytest.mark.parametrize(("cc", "family"), [
    ((7, 0), "volta"), ((7, 5), "turing"), ((8, 0), "ampere"), ((8, 6), "ampere"),
    ((8, 9), "ada-lovelace"), ((9, 0), "hopper"), ((10, 0), "blackwell"),
    ((12, 0), "blackwell"), ((13, 0), "rubin"), ((4, 0), "undefined")])
def test_gfd_family_by_compute_capability(cc: tuple[int, int], family: str) -> None:
    assert ga.gfd_family(*cc) == family
