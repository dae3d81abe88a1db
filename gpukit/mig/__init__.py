"""MIG planning without NVML: one package for every program that reasons about MIG layouts.

* ``state``     what a node's GPUs look like (plain data, filled by the agent's NVML backend)
* ``placement`` packing GPU instances into the placement tables (search with backtracking)
* ``planner``   config + GPUs -> validated plan (targets and the fewest actions)
* ``declared``  a layout against the GPUs an inventory declares (product and count)

The configs are mig-parted v1 (``gpukit.contracts.mig_parted``), the tables
``gpukit.contracts.mig_profiles``; this package imports nothing else of gpukit. The MIG manager
(``gpukit.plugin.mig``: NVML, applier, hooks) plans with it, the inventory model validates a
declared layout with it, provisioning checks the declarations it writes with it.
"""
