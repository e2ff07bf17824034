"""NCCL and RCCL through ctypes: ``library.py`` finds the library and declares its functions."""
