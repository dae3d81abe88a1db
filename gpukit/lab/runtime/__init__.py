"""The lab's stand-in for NVIDIA's container runtime (`nvidia-container-runtime`).

`nvidia_container_runtime.py` is one self-contained file (standard library only, PyYAML for
YAML CDI specs): the lab's `nvidia-container-toolkit` package ships it into the nodes, where
containerd's runc shim runs it in place of runc.
"""
