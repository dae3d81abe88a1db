"""The lab's stand-ins for NVIDIA's MPS tools (`nvidia-cuda-mps-control`, `nvidia-cuda-mps-server`).

`mps_control.py` is one self-contained file (standard library only): the lab's driver package
ships it into the nodes behind the two tools' names.
"""
