"""gpusched: run a suite of fine-tuning jobs across a multi-GPU box.

Importing this package is light on purpose (no torch, no rich, no NVML): ``gpusched status``
must answer instantly.
"""

__version__ = "0.1.0"
