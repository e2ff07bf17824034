"""Where does Kernel.launch spend its time on this machine? (a diagnostic, not a benchmark)"""
import ctypes, sys, threading, timeit
sys.path.insert(0, ".")
import shimrt
from cuda.bindings import driver
dev = shimrt.Device()
k = dev.load(dev.compile(shimrt.kernels.source("vector_ops"), name="vector_ops.cu"))["empty"]
buf = dev.alloc(4); s = dev.stream()
fn, h = k._fn, s._handle
v = ctypes.c_uint64(buf.ptr); arr = (ctypes.c_void_p * 1)(ctypes.addressof(v)); addr = ctypes.addressof(arr)
raw = driver.cuLaunchKernel
def nop(*a): return (0,)
N = 20000
def t(stmt):
    r = min(timeit.repeat(stmt, globals=globals(), number=N, repeat=5)) / N * 1e9
    s.synchronize(); return r
print(f"python call of a no-op (*a):        {t('nop(fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0)'):7.0f} ns")
print(f"raw cuLaunchKernel pre-packed:      {t('raw(fn, 1, 1, 1, 32, 1, 1, 0, h, addr, 0)'):7.0f} ns")
print(f"Kernel.launch real:                 {t('k.launch(1, 32, buf, stream=s)'):7.0f} ns")
real = k._launch
k2 = k; 
from shimrt import fastlaunch
k._launch = nop; k.launch = fastlaunch.build(k, shimrt.Stream)
print(f"Kernel.launch with a no-op driver:  {t('k.launch(1, 32, buf, stream=s)'):7.0f} ns")
k._launch = real; k.launch = fastlaunch.build(k, shimrt.Stream)
print(f"Kernel.launch real again:           {t('k.launch(1, 32, buf, stream=s)'):7.0f} ns")
