"""The NVML source and what it is made of: lib (NVML itself), state, source, mig_gpm, events."""
