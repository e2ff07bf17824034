"""The HIP backend: hip-python's HIP runtime (``driver.py``) and hipRTC (``rtc.py``).

It mirrors ``shimrt.cuda`` name for name. Only modules in this package import hip-python;
every call goes through ``check.py``.
"""

__all__ = ["NAME"]

NAME = "hip"
