"""Diagnose: does NVRTC's program log always carry ptxas' -v report? (one-off probe)"""
import sys
from cuda.bindings import nvrtc
sys.path.insert(0, ".")
from shimrt import kernels
print("nvrtc", nvrtc.nvrtcVersion())
src = kernels.source("smem_ops").encode()
inc = f"-I{kernels.directory()}".encode()
for opts in ([b"-Xptxas=-v"], [b"--ptxas-options=-v"], [b"-Xptxas", b"-v"], [b"-Xptxas=-v", b"-Xptxas=-warn-spills"]):
    for arch in (b"sm_90", b"sm_80"):
        for rep in range(3):
            _, p = nvrtc.nvrtcCreateProgram(src, b"x.cu", 0, [], [])
            o = [b"--gpu-architecture=" + arch, inc] + opts
            r = nvrtc.nvrtcCompileProgram(p, len(o), o)
            _, n = nvrtc.nvrtcGetProgramLogSize(p)
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(p, log)
            lines = [l for l in log.decode(errors="replace").splitlines() if "Used" in l or "entry" in l]
            print(opts, arch.decode(), rep, r[0], n, lines)
            nvrtc.nvrtcDestroyProgram(p)
