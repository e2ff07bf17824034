"""The HIP backend (hip-python: HIP runtime and hipRTC), mirroring ``shimrt.cuda`` name for name.

Not yet implemented: ``Device(backend="hip")`` raises NoDeviceError saying so, and gfx90a
targets are not yet known to ``shimrt.targets``.
"""

NAME = "hip"
