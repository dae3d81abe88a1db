"""A prepared claim's device metadata files (KEP-5304; the layout and format in
gpukit.contracts.dra_metadata): one file per request under the plugin directory, holding the
request's devices with the attributes this node publishes for them, and the CDI mount that
binds it read-only into the containers that use the request. The mount goes into the claim's
own CDI spec, on the request's first device (as the upstream helper injects it once per
request), so the checkpoint records it and a restart restores it with the spec."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpukit.contracts import dra_metadata as contract
from gpukit.contracts.dra import DRIVER


def claim_dir(root: str, namespace: str, name: str) -> Path:
    return Path(root) / f"{namespace}_{name}"


def host_path(root: str, namespace: str, name: str, request: str) -> Path:
    return claim_dir(root, namespace, name) / contract.base_request(request) / "metadata.json"


def stream(claim: Mapping[str, Any], request: str,
           devices: Sequence[tuple[str, str, Mapping[str, Any]]]) -> str:  # fmt: skip
    """The file's text: one DeviceMetadata per version, newest first, one per line.
    `devices`: (pool, device name, its published attributes)."""
    meta = claim.get("metadata") or {}
    pod_claim = (meta.get("annotations") or {}).get(contract.POD_CLAIM_NAME_ANNOTATION)
    body: dict[str, Any] = {
        "kind": contract.KIND,
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                     "uid": meta.get("uid"), "generation": 1},
        **({"podClaimName": pod_claim} if pod_claim else {}),
        "requests": [{"name": request, "devices": [
            {"driver": DRIVER, "pool": pool, "name": name,
             **({"attributes": dict(attrs)} if attrs else {})}
            for pool, name, attrs in devices]}],
    }  # fmt: skip
    return "".join(json.dumps({"apiVersion": f"{contract.GROUP}/{v}", **body},
                              sort_keys=True) + "\n" for v in contract.VERSIONS)  # fmt: skip


def mount(root: str, claim: Mapping[str, Any], request: str) -> dict[str, Any]:
    meta = claim.get("metadata") or {}
    pod_claim = (meta.get("annotations") or {}).get(contract.POD_CLAIM_NAME_ANNOTATION)
    return {
        "hostPath": str(host_path(root, meta["namespace"], meta["name"], request)),
        "containerPath": contract.container_path(DRIVER, meta["name"], pod_claim, request),
        "options": ["ro", "bind"],
    }


def write(root: str, claim: Mapping[str, Any], request: str,
          devices: Sequence[tuple[str, str, Mapping[str, Any]]]) -> None:  # fmt: skip
    """Write one request's file (atomically: a container never binds half a file)."""
    meta = claim["metadata"]
    path = host_path(root, meta["namespace"], meta["name"], request)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(stream(claim, request, devices), encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def remove(root: str, namespace: str, name: str) -> None:
    shutil.rmtree(claim_dir(root, namespace, name), ignore_errors=True)


def missing(root: str, edits: Mapping[str, Any]) -> bool:
    """Whether recorded container edits bind a metadata file that is not on disk."""
    return any(str(m.get("hostPath", "")).startswith(f"{root.rstrip('/')}/")
               and not os.path.isfile(m["hostPath"])
               for m in edits.get("mounts") or [])  # fmt: skip
