"""Formats gpukit shares with NVIDIA's tools and with Kubernetes, defined once.

Everything else imports these; they import nothing of gpukit outside this package (a test,
tests/unit/test_import_direction.py, fails when one does):

* ``plugin_config``  NVIDIA's device plugin config file, ``version: v1`` (schema and parser)
* ``mig_parted``     mig-parted's ``version: v1`` MIG layouts (schema and parser)
* ``mig_profiles``   the MIG profile and placement tables of each MIG-capable GPU
* ``label_names``    every ``nvidia.com/`` and ``gpukit.io/`` label, annotation and resource name
* ``label_syntax``   Kubernetes' label key/value syntax
* ``config_versions``  versioned config names a rolling change labels nodes with
* ``device_ids``     the device IDs the node agent gives the kubelet (replicas, MIG resources)
* ``dra``            NVIDIA's DRA driver names (driver, DeviceClasses, CDI kind, kubelet paths)
                     and its ResourceSlice device-name rule (built and parsed only here)
* ``dra_claim_config``  NVIDIA's DRA claim parameters (``resource.nvidia.com/v1beta1``
                     ``GpuConfig`` / ``MigDeviceConfig``), validated as its driver decodes them
* ``dra_checkpoint``  NVIDIA's DRA kubelet plugin's checkpoint (v1/v2 and their checksums)
* ``gpu_architectures``  NVML's architecture codes, NVIDIA's spellings, GFD's gpu.family
* ``nvidia_driver``  NVIDIA's driver channels and packages; a declared driver (``DriverSpec``)
* ``runtime_hardening``  the device plugin strategies that reach unprivileged containers
* ``bounded_yaml``   YAML reading with size and depth bounds, for files users bring
"""
