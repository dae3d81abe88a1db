"""Data files shipped with gpukit (mig_profiles.yaml: the MIG tables, see gpukit.mig_profiles)."""
