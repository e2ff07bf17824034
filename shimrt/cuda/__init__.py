"""The CUDA backend: cuda-python's driver API (``driver.py``) and NVRTC (``rtc.py``).

Only modules in this package import ``cuda.bindings``; every call goes through ``check.py``.
"""

__all__ = ["NAME"]

NAME = "cuda"
