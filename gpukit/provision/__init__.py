"""The decisions behind gpukit's Ansible roles, as tested Python.

The roles' modules (the `gpukit.gpu` collection under `collections/`) are thin adapters:
they gather what is on the node, call these functions, and apply or report the result.

* ``driver``     driver packages per OS family and channel, branch pin, version plan, reboot
* ``runtime``    containerd (config v2/v3, in place or drop-in) and CRI-O for the nvidia runtime
* ``cdi``        the node's CDI spec from NVML discovery
* ``gpu_facts``  driver version, GPUs and MIG mode through NVML
* ``sharing``    checks of a node's sharing declarations (device plugin config, MIG layout)
* ``mig``        the MIG manager's config file and its plan/apply runs
* ``agent``      the device plugin DaemonSet's objects from role variables
* ``nodes``      node labels and taints, merged with what others set
* ``wheelhouse`` gpukit's wheels for nodes without PyPI, built on the controller
* ``edit``       the result type of every file plan (before, after, changes, diff)
"""
