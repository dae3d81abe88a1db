"""gpukit: GPU nodes for Kubernetes, declared in an inventory, provisioned and proven."""

__version__ = "0.1.0"
