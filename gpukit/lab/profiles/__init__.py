"""Node GPU profiles for the mock NVML (YAML; format in README.md beside this file)."""
