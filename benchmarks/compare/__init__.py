"""`make bench-compare`: gpuconsole beside gpustat, nvitop and nvitop-exporter, on one fake NVML.

Every tool loads the same fake ``libnvidia-ml.so.1`` (gpuconsole/sim/fakenvml) with the same
8-GPU DGX H100 profile, so they all read the same GPUs through their own NVML bindings. The
other tools live in their own virtual environment (``.venv-compare``, pinned in
``requirements.txt`` beside this file); gpuconsole runs from the project's. Not run by
``make bench``: that one globs ``benchmarks/bench_*.py``.
"""
