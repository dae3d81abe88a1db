"""Device IDs and resource names as the node agent gives them to the kubelet.

NVIDIA's device plugin names a time-sliced replica `<uuid>::<n>` and a MIG resource
`nvidia.com/mig-<profile>`; pods, the kubelet's PodResources API and dashboards see these
strings, so the agent, the provisioning code and the conformance suite read and write them here.
"""

from __future__ import annotations

from dataclasses import dataclass

REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, order=True)
class ReplicaId:
    """One time-sliced share of a device: `GPU-…::3` is replica 3 of `GPU-…`."""

    device: str
    replica: int

    def __str__(self) -> str:
        return f"{self.device}{REPLICA_SEPARATOR}{self.replica}"

    @classmethod
    def parse(cls, device_id: str) -> ReplicaId | None:
        """The replica a device ID names, or None for an ID that is not a replica's."""
        device, sep, n = device_id.rpartition(REPLICA_SEPARATOR)
        if not sep or not device or not n.isdigit():
            return None
        return cls(device, int(n))


def replica_id(uuid: str, n: int) -> str:
    return str(ReplicaId(uuid, n))


def strip_replica(device_id: str) -> str:
    """The physical device an ID stands for (the ID itself when it is no replica's)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def mig_resource_name(profile: str) -> str:
    """`1g.5gb+me` -> `nvidia.com/mig-1g.5gb.me` (resource names cannot hold `+`)."""
    return f"nvidia.com/mig-{profile.replace('+', '.')}"
