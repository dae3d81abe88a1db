"""Kubernetes access, one layer for every gpukit program that talks to the API.

* ``connect``   the API client: a kubeconfig given, else $KUBECONFIG / ~/.kube/config, else the
  pod's ServiceAccount (or the other order, for the node agent that runs in a pod)
* ``objects``   server-side apply and delete of manifests, read the way `kubectl apply` does
* ``nodes``     what gpukit reads of Node objects: extended resource counts, readiness, reports
* ``waits``     watching a pod or a DaemonSet until it gets where a caller needs it
* ``names``     DNS-1123 names for the objects gpukit creates

The node agent (gpukit/plugin/node_api.py), the conformance suite (gpukit/conformance/cluster.py)
and the lab build their clients here; roles reach the API through kubernetes.core modules instead.
It imports only gpukit.contracts (tests/unit/test_import_direction.py).
"""
