"""The CNCF Kubernetes AI Conformance checklist (cncf/ai-conformance, docs/AIConformance-1.xx.yaml):
the submission's PRODUCT.yaml has `metadata` and a `spec` of categories, each a list of
requirements {id, description, level, status, evidence, notes}; `status` is one of STATUSES.
Ids and categories as the checklists since 1.34 name them; descriptions here are gpukit's short
summaries (the submitter keeps the checklist's own text)."""

from __future__ import annotations

from dataclasses import dataclass

SECURE_ACCELERATOR_ACCESS = "secure_accelerator_access"
GPU_SHARING = "gpu_sharing"
DRIVER_RUNTIME_MANAGEMENT = "driver_runtime_management"
DRA_SUPPORT = "dra_support"
ACCELERATOR_METRICS = "accelerator_metrics"

IMPLEMENTED = "Implemented"
PARTIALLY_IMPLEMENTED = "Partially Implemented"
NOT_IMPLEMENTED = "Not Implemented"
NOT_APPLICABLE = "N/A"
STATUSES = (IMPLEMENTED, NOT_IMPLEMENTED, PARTIALLY_IMPLEMENTED, NOT_APPLICABLE)
LEVELS = ("MUST", "SHOULD")
METADATA_FIELDS = (
    "kubernetesVersion", "platformName", "platformVersion", "vendorName", "websiteUrl",
    "repoUrl", "documentationUrl", "productLogoUrl", "description", "contactEmailAddress",
    "k8sConformanceUrl",
)
REQUIREMENT_FIELDS = ("id", "description", "level", "status", "evidence", "notes")


@dataclass(frozen=True)
class Requirement:
    category: str
    id: str
    level: str
    summary: str


CHECKLIST = (
    Requirement("accelerators", DRA_SUPPORT, "MUST",
                "DRA APIs for accelerator requests beyond counts"),
    Requirement("accelerators", DRIVER_RUNTIME_MANAGEMENT, "SHOULD",
                "compatible drivers and runtime configuration verifiably installed"),
    Requirement("accelerators", GPU_SHARING, "SHOULD",
                "at least one GPU sharing strategy (partitioning or time-slicing)"),
    Requirement("accelerators", "virtualized_accelerator", "SHOULD",
                "virtualized accelerators (vGPU) exposed and managed"),
    Requirement("networking", "ai_inference", "MUST",
                "Gateway API implementation for inference traffic"),
    Requirement("schedulingOrchestration", "gang_scheduling", "MUST",
                "a gang scheduling solution installs and works"),
    Requirement("schedulingOrchestration", "cluster_autoscaling", "MUST",
                "node groups of an accelerator type scale on pending pods"),
    Requirement("schedulingOrchestration", "pod_autoscaling", "MUST",
                "HorizontalPodAutoscaler works for accelerator pods"),
    Requirement("observability", ACCELERATOR_METRICS, "MUST",
                "per-accelerator utilisation and memory metrics on a standard endpoint"),
    Requirement("observability", "ai_service_metrics", "MUST",
                "workload metrics in Prometheus format discovered and collected"),
    Requirement("security", SECURE_ACCELERATOR_ACCESS, "MUST",
                "accelerator access isolated and mediated by device plugin or DRA and the "
                "runtime"),
    Requirement("operator", "robust_controller", "MUST",
                "a complex AI operator with a CRD installs and reconciles"),
)
IDS = frozenset(r.id for r in CHECKLIST)
