"""gpukit node agent: the Kubernetes device plugin for NVIDIA GPUs (and its labels).

Modules, one concept each: config (schema) and config_source (file/label/flag/env selection),
nvml (discovery via pynvml) into inventory (plain data), resources (strategies, time-slicing),
allocate, preferred, cdi, health, labels (+ label_names), metrics, server (gRPC), manager
(lifecycle), signals (stop, reload, rescan), cli (entry point). api/ holds the kubelet .proto
files and their generated stubs.
"""
