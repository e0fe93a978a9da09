"""Readings of the sources beyond NVML (BMC, fabric), one module per kind.

NodeSnapshot (gpuconsole.model) carries one optional reading of each kind.
"""
