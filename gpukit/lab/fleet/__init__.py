"""A simulated fleet for the API-side parts at hundreds of nodes, without kubelets.

`inventory` writes an Ansible inventory of N hosts of the lab's GPU profiles; `standin`
registers each as an API-only Node (its GPU capacity, allocatable and labels as a node agent
that serves the declaration would report them), keeps its Ready condition and Lease fresh as a
kubelet would, and removes them. `python -m gpukit.lab.fleet` runs both against a lab instance
whose control plane alone is up.
"""
