"""The node agent's DRA side: a kubelet DRA plugin serving the node's GPUs through
resource.k8s.io/v1 under NVIDIA's driver name (`gpu.nvidia.com`).

* ``names``        NVIDIA's driver, device, attribute and CDI names, the kubelet's paths
* ``slice_devices`` the node's GPUs and MIG devices as ResourceSlice devices (plain data)
* ``slices``       publishing them: one pool per node, generations, stale slices removed
* ``opaque``       NVIDIA's opaque claim parameters (GpuConfig, MigDeviceConfig), validated
* ``checkpoint``   prepared claims on the node, written atomically
* ``claim_cdi``    the CDI spec of one prepared claim
* ``prepare``      NodePrepareResources / NodeUnprepareResources, idempotent
* ``server``       the gRPC side: plugin registration and the DRAPlugin service
* ``health_stream`` the kubelet's DRA health stream (device health in pod status)
* ``agent``, ``cli`` the process: discovery, health, republishing, signals, and the node
  agent's GPU metrics and /readyz (a DRA node runs no agent)
"""
