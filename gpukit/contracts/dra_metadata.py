"""DRA device metadata (KEP-5304, beta in Kubernetes 1.37): what a container finds about the
devices of its claims, as k8s.io/dynamic-resource-allocation's kubeletplugin writes it and
its devicemetadata package reads it (v0.37).

- In the container, read-only: `/var/run/kubernetes.io/dra-device-attributes/` then
  `resourceclaims/<claim name>/` (a claim the pod names) or `resourceclaimtemplates/<pod
  claim name>/` (a claim made from a template: the name in pod.spec.resourceClaims, since
  the claim's own name is generated), then `<request>/<driver>-metadata.json`. A request of a
  prioritized list is named without its subrequest.
- The file is a JSON stream: the same DeviceMetadata object once per API version, newest
  first, so a reader takes the first version it knows. The object: apiVersion, kind, metadata
  {name, namespace, uid, generation}, podClaimName (template claims only), requests [{name
  (with its subrequest), devices [{driver, pool, name, attributes (as the ResourceSlice
  publishes them)}]}].
- On the host the driver keeps the files under its plugin directory and binds each into the
  container through CDI.
"""

from __future__ import annotations

GROUP = "metadata.resource.k8s.io"
# Newest first: the order of the objects in a file. v1beta1 must be there (the helper refuses
# to start without it); v1alpha1 (1.36) has the same fields, for readers of that release.
VERSIONS = ("v1beta1", "v1alpha1")
KIND = "DeviceMetadata"

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
RESOURCE_CLAIMS_SUBDIR = "resourceclaims"
RESOURCE_CLAIM_TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
# Set by the ResourceClaim controller on a claim made from a template: the pod's name for it.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# The driver's own copies, under its plugin directory.
HOST_SUBDIR = "dra-device-metadata"


def base_request(request: str) -> str:
    """"gpu/big" (a subrequest of a prioritized list) -> "gpu": the file is per request."""
    return request.split("/", 1)[0]


def container_path(driver: str, claim_name: str, pod_claim_name: str | None,
                   request: str) -> str:  # fmt: skip
    if pod_claim_name:
        where = f"{RESOURCE_CLAIM_TEMPLATES_SUBDIR}/{pod_claim_name}"
    else:
        where = f"{RESOURCE_CLAIMS_SUBDIR}/{claim_name}"
    return f"{CONTAINER_DIR}/{where}/{base_request(request)}/{driver}{FILE_SUFFIX}"
