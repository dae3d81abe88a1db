"""gpukit node agent: the Kubernetes device plugin for NVIDIA GPUs (and its labels).

Modules, one concept each: config_source (file/label/flag/env selection of NVIDIA's config,
whose schema is gpukit.contracts.plugin_config), nvml (the NVML layer: discovery, XID events,
MIG instances) into devices (plain data), resources (strategies, time-slicing), allocate,
preferred, cdi, health, labels, metrics, metrics_auth (who may scrape them), node_api (the
node's labels and events, the scrapers' token reviews), server
(gRPC), manager (lifecycle), signals (stop, reload, rescan), cli (entry point), mig/ (the MIG
manager). api/ holds the kubelet .proto files and their generated stubs.
"""
