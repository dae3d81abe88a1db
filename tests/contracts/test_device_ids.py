"""Device IDs as the kubelet sees them: `<uuid>::<n>` replicas, `nvidia.com/mig-<profile>`."""

from __future__ import annotations

import pytest

from gpukit.contracts.device_ids import ReplicaId, mig_resource_name, replica_id, strip_replica


def test_replica_ids_round_trip() -> None:
    uuid = "GPU-8a2b6b8e-0000-0000-0000-000000000001"
    assert replica_id(uuid, 3) == f"{uuid}::3"
    assert ReplicaId.parse(f"{uuid}::3") == ReplicaId(uuid, 3)
    assert strip_replica(f"{uuid}::3") == uuid
    assert strip_replica(uuid) == uuid


@pytest.mark.parametrize("device_id", ["GPU-1", "GPU-1::", "::3", "GPU-1::x", "GPU-1::-1"])
def test_ids_that_are_no_replicas(device_id: str) -> None:
    assert ReplicaId.parse(device_id) is None


def test_mig_device_replica_keeps_its_uuid() -> None:
    # A MIG device's UUID holds no `::`, so the last separator splits the replica number off.
    assert ReplicaId.parse("MIG-5c3f2e1a-aaaa-bbbb-cccc-000000000000::12") == ReplicaId(
        "MIG-5c3f2e1a-aaaa-bbbb-cccc-000000000000", 12)


def test_mig_resource_names() -> None:
    assert mig_resource_name("1g.5gb") == "nvidia.com/mig-1g.5gb"
    assert mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
