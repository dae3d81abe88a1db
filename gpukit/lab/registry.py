"""The lab's OCI registry: Debian's docker-registry (the distribution project's registry 2.8),
serving plain HTTP on the lab bridge at `<host address>:5000`, its storage in the lab's state
directory. Images are pushed to it with buildah; the nodes' containerd pulls from it through
a hosts.toml under /etc/containerd/certs.d (the lab's containerd config sets that config_path,
as a cluster installer would), so a DaemonSet can name an image by tag or `@sha256:` digest as
it would in production. Pushes are `skopeo copy` (from an OCI or docker archive, or buildah's
storage), skopeo and docker-registry being the lab's host packages (make deps).

    python -m gpukit.lab.registry push SOURCE REPOSITORY:TAG   # prints REGISTRY/REPO@sha256:...

The registry starts on first use (`ensure`) and stops with `gpukit lab down`.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpukit.lab.config import LabSpec, load_spec, state_dir

PORT = 5000
PROC = "registry"
BINARY = "docker-registry"  # Debian's package and command (the lab's apt deps install it)
CERTS_D = "/etc/containerd/certs.d"  # the config_path of the lab's containerd configs


class RegistryError(RuntimeError):
    """The registry could not be started or pushed to; the message says which and why."""


def address(lab: LabSpec) -> str:
    """host:port of the lab's registry, as nodes and image references name it."""
    return f"{lab.host_address}:{PORT}"


def config_text(lab: LabSpec, storage: Path) -> str:
    """docker-registry's configuration: filesystem storage, HTTP on the lab bridge only."""
    doc = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        # One registry process: the secret only signs its own upload state.
        "http": {"addr": address(lab), "secret": secrets.token_hex(16)},
    }
    return json.dumps(doc, indent=1) + "\n"  # JSON is YAML: no yaml dump of floats to mind


def hosts_toml(lab: LabSpec) -> str:
    """containerd's hosts.toml for the registry: plain HTTP, pull and resolve."""
    url = f"http://{address(lab)}"
    return (f'# Written by the gpukit lab: its registry (gpukit.lab.registry), plain HTTP.\n'
            f'server = "{url}"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n')


def node_files(lab: LabSpec) -> dict[str, str]:
    """Files every node's root carries for the registry (path inside the node: content)."""
    return {f"{CERTS_D}/{address(lab)}/hosts.toml": hosts_toml(lab)}


def answers(lab: LabSpec, timeout: float = 2.0) -> bool:
    """Whether the registry answers its API's version check (GET /v2/: 200)."""
    try:
        with urllib.request.urlopen(f"http://{address(lab)}/v2/", timeout=timeout) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def ensure(lab: LabSpec, timeout: float = 30.0) -> str:
    """The registry running and answering (started where it is not); its address."""
    from gpukit.lab.cluster import table
    from gpukit.lab.network import ensure_bridge

    binary = shutil.which(BINARY)
    if binary is None or shutil.which("skopeo") is None:
        raise RegistryError(f"{BINARY} or skopeo is not installed: `make deps` installs the "
                            "lab's host packages (gpukit/lab/scripts/install-deps.sh)")  # fmt: skip
    t = table()
    proc = t.get(PROC)
    if proc is None or not proc.alive():
        ensure_bridge(lab)  # the address it binds
        home = state_dir() / "registry"
        (home / "storage").mkdir(parents=True, exist_ok=True)
        cfg = home / "config.yml"
        cfg.write_text(config_text(lab, home / "storage"))
        t.start(PROC, [binary, "serve", str(cfg)], state_dir() / "logs" / "registry.log")
    deadline = time.monotonic() + timeout
    while not answers(lab):
        if time.monotonic() > deadline:
            raise RegistryError(f"registry at {address(lab)} not answering after {timeout:.0f}s;"
                                f" see {state_dir() / 'logs' / 'registry.log'}")  # fmt: skip
        time.sleep(0.3)
    return address(lab)


def stop() -> None:
    from gpukit.lab.cluster import table

    table().stop(PROC)


def push(lab: LabSpec, source: str, target: str) -> str:
    """Copy `source` (a containers transport reference: oci-archive:PATH as `make dist` writes
    the agent image, docker-archive:PATH as the lab builds it, containers-storage:NAME) to the
    registry as `target` (repository:tag) with skopeo; the pushed image by digest:
    `<registry>/<repository>@sha256:...` (the digest of the manifest the registry stores)."""
    import subprocess

    registry = ensure(lab)
    repository = target.rsplit(":", 1)[0] if ":" in target.rsplit("/", 1)[-1] else target
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        r = subprocess.run(
            ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile",
             str(digest_file), source, f"docker://{registry}/{target}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if r.returncode != 0:
            raise RegistryError(f"skopeo copy {source} to {registry}/{target} failed: "
                                f"{r.stderr.strip()[-500:]}")  # fmt: skip
        digest = digest_file.read_text().strip()
    return f"{registry}/{repository}@{digest}"


def main(argv: list[str]) -> int:
    lab = load_spec()
    if argv[:1] == ["push"] and len(argv) == 3:
        print(push(lab, argv[1], argv[2]))
        return 0
    if argv == ["up"]:
        print(ensure(lab))
        return 0
    print("usage: python -m gpukit.lab.registry up | push SOURCE REPOSITORY:TAG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
