"""A pytest-kubernetes provider for the gpukit lab.

Tests ask for the lab like for any other provider; a lab that was already up
before the tests is left up afterwards, one the provider brought up is taken down.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_kubernetes.options import ClusterOptions
from pytest_kubernetes.providers.base import AClusterManager

from gpukit.lab import cluster, nodes
from gpukit.lab.config import load_spec
from gpukit.lab.controlplane import paths


class LabManager(AClusterManager):  # type: ignore[misc]
    """The lab cluster as a pytest-kubernetes cluster manager."""

    def __init__(
        self,
        cluster_name: str | None = "gpukit-lab",
        provider_config: str | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.spec = load_spec()
        bindir = cluster.kubernetes_bindir(self.spec)
        # pytest-kubernetes runs `kubectl` from PATH: use the lab's own build.
        if str(bindir) not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        super().__init__(cluster_name, provider_config, kubeconfig or paths().admin_kubeconfig)

    @classmethod
    def get_binary_name(cls) -> str:
        return "kubectl"

    def _on_create(self, cluster_options: ClusterOptions, **kwargs: Any) -> None:
        self._cluster_options.kubeconfig_path = cluster.up(self.spec)

    def _on_delete(self) -> None:
        cluster.down(self.spec)

    def create(
        self, cluster_options: ClusterOptions | None = None, timeout: int = 20, **kwargs: Any
    ) -> None:
        if cluster.status(self.spec).up:
            # An up lab may run images built from an older checkout: bring them up to date.
            cluster.ensure_images(self.spec)
            self._created = False
            return
        self._on_create(self._cluster_options)
        self._created = True

    def delete(self) -> None:
        # Never unlink the lab's kubeconfig (the base class would): the lab owns it.
        if self._created:
            self._on_delete()

    def load_image(self, image: str) -> None:
        """Import an image archive (a path to a tar) into every node's containerd."""
        for n in self.spec.nodes:
            target = nodes.root(n) / "tmp" / Path(image).name
            target.write_bytes(Path(image).read_bytes())
            cluster.node_exec(n, ["ctr", "-n", "k8s.io", "images", "import", f"/tmp/{target.name}"])
            target.unlink()
